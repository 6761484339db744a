# chassis-worker: one image for every role (SERVICE_ROLE=api|worker|all) and for `migrate`.
#
#   docker build -t chassis-worker .
#   docker run --rm -e DATABASE_URL=postgresql://... -p 127.0.0.1:8080:8080 chassis-worker
#
# Stage 1 installs the project and every dependency into a virtualenv at /opt/chassis; stage 2
# copies that one directory onto a fresh base, so the final image carries no build tools, no
# sources and no wheels. Plain Dockerfile instructions only (no `# syntax` line, no RUN --mount):
# the legacy builder, `docker-compose` 1.x and BuildKit all build it, and no frontend is fetched.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The same path in both stages: the venv's scripts name its interpreter in their #! line.
RUN python -m venv /opt/chassis
WORKDIR /src
# Everything the wheel is made of (pyproject.toml): the metadata, the readme hatch reads, both
# packages, and migrations/ which hatch force-includes as worker/_migrations.
COPY pyproject.toml README.md ./
COPY api_sender ./api_sender
COPY worker ./worker
COPY migrations ./migrations
RUN /opt/chassis/bin/pip install .

FROM ${PYTHON_IMAGE} AS runtime
# The venv first on PATH: `chassis-worker` and `python` are its own, and a `pip install` in an
# image built FROM this one (TOOL_JOBS packages) lands next to chassis-worker.
ENV PATH=/opt/chassis/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HTTP_HOST=0.0.0.0 \
    HTTP_PORT=8080 \
    LOG_FORMAT=json
RUN groupadd --system --gid 10001 chassis \
    && useradd --system --uid 10001 --gid chassis --home-dir /app --shell /usr/sbin/nologin chassis \
    && mkdir -p /app \
    && chown chassis:chassis /app
# Owned by root: the service user can run the code but not change it.
COPY --from=build /opt/chassis /opt/chassis
WORKDIR /app
USER 10001:10001
EXPOSE 8080
# Liveness only (the process's loop answers); readiness is /readyz, which turns 503 while the
# database is away, and restarting a process for that would only make a crash loop.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HTTP_PORT', '8080'), timeout=4)"]
# The first SIGTERM drains within SHUTDOWN_GRACE_SECONDS; give `docker stop -t` (compose:
# stop_grace_period) that grace plus about 20 s for hand-back and flush.
STOPSIGNAL SIGTERM
CMD ["chassis-worker", "run"]
