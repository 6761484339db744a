"""The Dockerfile, read as Docker reads it, checked against pyproject.toml, the CLI and settings."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.files import (
    DOCKERFILE,
    NON_SETTINGS_ENV,
    ROOT,
    SETTINGS_VARIABLES,
    check_cli_argv,
    dockerfile,
    dockerignore_patterns,
    dockerignored,
    pyproject,
)
from tests.support.processes import start_daemon
from worker.settings import Settings

BUILD_TOOLS = ("gcc", "build-essential", "make ", "clang", "python3-dev", "libpq-dev", "git ")


def test_dockerfile_builds_a_venv_then_copies_it_to_a_slim_base() -> None:
    """Two stages on slim Python 3.11: the first makes a venv and installs the project into it,
    the last copies that venv from the first, at the same path, and puts it first on PATH."""
    parsed = dockerfile()
    assert len(parsed.stages) >= 2
    for stage in parsed.stages:
        assert re.fullmatch(r"python:3\.11-slim(-\w+)?", stage.base), stage.base
    build, final = parsed.stages[0], parsed.final_stage
    runs = [i.args for i in build.all("RUN")]
    venv = re.fullmatch(r"python -m venv (/\S+)", runs[0])
    assert venv, runs[0]
    venv_path = venv[1]
    assert f"{venv_path}/bin/pip install ." in runs
    copies = [i.args.split() for i in final.all("COPY")]
    assert [f"--from={build.name}", venv_path, venv_path] in copies
    assert final.env()["PATH"].startswith(f"{venv_path}/bin:")


def test_dockerfile_needs_no_buildkit() -> None:
    """Nothing in the Dockerfile needs BuildKit, so the legacy builder (docker-compose 1.x, a
    docker without buildx) builds it too: no `# syntax` frontend to fetch, no RUN --mount, no
    heredocs, no COPY --link or --chmod."""
    text = DOCKERFILE.read_text()
    first = text.splitlines()[0]
    assert not re.match(r"#\s*syntax\s*=", first, flags=re.IGNORECASE), first
    instructions = [i for stage in dockerfile().stages for i in stage.instructions]
    for instruction in instructions:
        assert not (instruction.keyword == "RUN" and "--mount" in instruction.args), instruction
        assert "<<" not in instruction.args, instruction
        if instruction.keyword in ("COPY", "ADD"):
            flags = {a.split("=")[0] for a in instruction.args.split() if a.startswith("--")}
            assert flags <= {"--from", "--chown"}, instruction


def test_dockerfile_final_stage_has_no_build_tools_or_sources() -> None:
    """The final stage installs no compiler and copies nothing but the build stage's venv."""
    parsed = dockerfile()
    final = parsed.final_stage
    text = " ".join(i.args for i in final.instructions).lower()
    for tool in BUILD_TOOLS:
        assert tool not in text, tool
    assert "apt-get install" not in text
    for copy in final.all("COPY"):
        assert copy.args.startswith(f"--from={parsed.stages[0].name} "), copy
    assert not final.all("ADD")


def test_dockerfile_runs_as_a_non_root_user() -> None:
    """The image's user is a numeric, non-root uid created in the final stage."""
    final = dockerfile().final_stage
    user = final.last("USER").args
    uid = user.split(":")[0]
    assert uid.isdigit(), user
    assert int(uid) != 0, user
    assert f"--uid {uid}" in " ".join(i.args for i in final.all("RUN"))


def test_dockerfile_environment_and_port() -> None:
    """The image sets HTTP_HOST=0.0.0.0, only variables the daemon reads (plus Python's), valid
    values, and EXPOSEs the HTTP_PORT it runs on."""
    env = dockerfile().final_stage.env()
    assert env["HTTP_HOST"] == "0.0.0.0"
    daemon_env = {k: v for k, v in env.items() if k in SETTINGS_VARIABLES}
    assert set(env) - set(daemon_env) <= NON_SETTINGS_ENV
    settings = Settings(_env_file=None, **{k.lower(): v for k, v in daemon_env.items()})
    exposed = [e.args for e in dockerfile().final_stage.all("EXPOSE")]
    assert exposed == [str(settings.http_port)]


def test_dockerfile_cmd_is_the_console_script() -> None:
    """CMD is `chassis-worker run` in exec form, a console script the CLI accepts, with no
    ENTRYPOINT in the way, and the image stops with SIGTERM."""
    final = dockerfile().final_stage
    argv = final.json_instruction("CMD")
    assert argv == ["chassis-worker", "run"]
    assert check_cli_argv(argv).command == "run"
    assert pyproject()["project"]["scripts"]["chassis-worker"] == "worker.cli:main"
    assert not final.all("ENTRYPOINT")
    assert final.last("STOPSIGNAL").args == "SIGTERM"
    assert "uvloop" in " ".join(pyproject()["project"]["dependencies"])


def test_dockerfile_build_stage_copies_everything_the_wheel_needs() -> None:
    """The build stage copies pyproject.toml, its readme, both packages and the force-included
    migrations, and .dockerignore leaves all of them in the context."""
    project = pyproject()
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    needed = {
        "pyproject.toml",
        project["project"]["readme"],
        *wheel["packages"],
        *wheel["force-include"],
    }
    copied = set()
    for instruction in dockerfile().stages[0].all("COPY"):
        sources = instruction.args.split()[:-1]
        copied.update(s.rstrip("/") for s in sources if not s.startswith("--"))
    assert needed <= copied, f"not copied: {sorted(needed - copied)}"
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not dockerignored(path), f".dockerignore drops {path}"
        if (ROOT / path).is_dir():
            for file in (ROOT / path).rglob("*"):
                if file.is_file() and "__pycache__" not in file.parts:
                    assert not dockerignored(str(file.relative_to(ROOT))), file


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    """.env files, the venv, git, local data and caches never reach the build context."""
    for path in (".env", ".env.production", ".venv/bin/python", ".git/config", ".data/pg"):
        assert dockerignored(path), path
    assert dockerignored("worker/__pycache__/cli.cpython-311.pyc")
    assert "!" not in "".join(p[0] for p in dockerignore_patterns())


def copy_like_docker(source: Path, target: Path, *, into_directory: bool) -> None:
    """Docker's COPY: a directory's contents go into the target, a file into or as the target;
    what .dockerignore excludes is not in the context, so it is not copied."""
    if source.is_dir():
        for file in source.rglob("*"):
            relative = file.relative_to(ROOT)
            if file.is_file() and not dockerignored(str(relative)):
                destination = target / file.relative_to(source)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, destination)
    else:
        assert not dockerignored(str(source.relative_to(ROOT))), source
        destination = target / source.name if into_directory else target
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)


@pytest.mark.slow
def test_wheel_built_from_the_docker_context_packages_the_migrations(tmp_path) -> None:
    """A wheel built from exactly what the build stage copies holds both packages, the
    migrations under worker/_migrations and the chassis-worker entry point."""
    pytest.importorskip("hatchling", reason="pip install hatchling (the build backend)")
    context = tmp_path / "context"
    for instruction in dockerfile().stages[0].all("COPY"):
        *sources, target = instruction.args.split()
        into_directory = target.endswith("/") or len(sources) > 1
        destination = context / target.removeprefix("./")
        for source in sources:
            copy_like_docker(ROOT / source, destination, into_directory=into_directory)
    out = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(out),
            str(context),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = out.glob("chassis_worker-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "chassis-worker = worker.cli:main" in archive.read(entry_points).decode()
    migrations = {p.name for p in (ROOT / "migrations").glob("*.sql")}
    assert migrations
    assert {f"worker/_migrations/{m}" for m in migrations} <= names
    assert "worker/cli.py" in names
    assert "api_sender/sender.py" in names
    assert "worker/py.typed" in names


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_healthcheck_command_probes_a_live_daemon(db_url: str, tmp_path) -> None:
    """The image's HEALTHCHECK command exits 0 against a running daemon's /healthz and non-zero
    once the daemon is gone."""
    argv = dockerfile().final_stage.json_instruction("HEALTHCHECK")
    assert argv[0] == "python"
    assert "/healthz" in " ".join(argv)
    # An api process on a migrated but not installed database: alive, and not ready.
    daemon = start_daemon(db_url, tmp_path, role="api", name="health")
    try:
        for _ in range(300):
            if daemon.get("/healthz")[0] == 200:
                break
            assert daemon.process.poll() is None, daemon.logs()
            await asyncio.sleep(0.1)
        assert daemon.get("/readyz")[0] == 503
        env = {**os.environ, "HTTP_PORT": str(daemon.port)}
        probe = [sys.executable, *argv[1:]]
        healthy = subprocess.run(probe, env=env, capture_output=True, timeout=10, check=False)
        assert healthy.returncode == 0, healthy.stderr
        assert daemon.stop() == 0
        sick = subprocess.run(probe, env=env, capture_output=True, timeout=10, check=False)
        assert sick.returncode != 0
    finally:
        daemon.kill()
