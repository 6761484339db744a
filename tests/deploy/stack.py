"""The compose project the deploy test runs.

It is the project's own compose.yaml and image, with a second compose file that adds test
fixtures only: a slow first init for postgres (a script in /docker-entrypoint-initdb.d) and a
long-running tool job for the workers (tests/deploy/stack mounted, ``TOOL_JOBS`` naming it).
Ports are free host ports, the token and the image tag the test's own, and an empty env file
keeps a developer's .env out.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.dockercli import Compose, Docker
from tests.deploy.files import COMPOSE
from tests.support.processes import free_port

PROJECT = "chassis-deploy-test"
IMAGE_TAG = "deploy-test"
INGEST_TOKEN = "deploy-test-token"
FIXTURES = Path(__file__).with_name("stack")
#: How long the fresh volume's first init takes (the temporary server runs all along).
SLOW_INIT_SECONDS = 20
#: Where the override mounts tests/deploy/stack in migrate and worker containers.
JOBS_MOUNT = "/opt/deploy-jobs"
#: compose.yaml's laptop defaults for the superuser and database.
SUPERUSER, SUPERUSER_PASSWORD, DATABASE = "postgres", "postgres-dev-only", "chassis"


def override() -> dict[str, Any]:
    """The test's compose file: fixtures added to the project's services, nothing replaced."""
    jobs = {
        "environment": {"PYTHONPATH": JOBS_MOUNT},
        "volumes": [f"{FIXTURES}:{JOBS_MOUNT}:ro"],
    }
    return {
        "services": {
            "postgres": {
                "environment": {"SLOW_INIT_SECONDS": str(SLOW_INIT_SECONDS)},
                "volumes": [
                    f"{FIXTURES / 'slow-init.sh'}:/docker-entrypoint-initdb.d/50-slow-init.sh:ro"
                ],
            },
            "migrate": jobs,
            "worker": jobs,
        }
    }


@dataclass
class Stack:
    """The running project: its compose command, ports and log of what the test saw."""

    compose: Compose
    ingest_port: int
    postgres_port: int
    note: Callable[[str], None]

    @classmethod
    def create(cls, docker: Docker, workdir: Path, note: Callable[[str], None]) -> Stack:
        """The project's files and environment (nothing started yet)."""
        extra = workdir / "compose.test.yaml"
        extra.write_text(yaml.safe_dump(override()))
        env_file = workdir / "empty.env"
        env_file.write_text("")
        ingest_port, postgres_port = free_port(), free_port()
        env = {
            "CHASSIS_TAG": IMAGE_TAG,
            "CHASSIS_INGEST_PORT": str(ingest_port),
            "POSTGRES_PORT": str(postgres_port),
            "INGEST_TOKEN": INGEST_TOKEN,
            "TOOL_JOBS": "deploy_jobs:JOBS",
            # docker-compose 1.29 runs `docker build` (the client first on PATH); the legacy
            # builder, the one every Docker has, so nothing in the Dockerfile may need BuildKit.
            "COMPOSE_DOCKER_CLI_BUILD": "1",
            "DOCKER_BUILDKIT": "0",
        }
        compose = Compose(docker, PROJECT, [COMPOSE, extra], env, ["--env-file", str(env_file)])
        return cls(compose, ingest_port, postgres_port, note)

    @property
    def docker(self) -> Docker:
        """The docker client."""
        return self.compose.docker

    @property
    def image(self) -> str:
        """The chassis-worker image compose builds."""
        return f"chassis-worker:{IMAGE_TAG}"

    def superuser_url(self) -> str:
        """The superuser's URL through the published PostgreSQL port."""
        return (
            f"postgresql://{SUPERUSER}:{SUPERUSER_PASSWORD}@127.0.0.1:{self.postgres_port}/"
            f"{DATABASE}"
        )

    def ingest_url(self, path: str) -> str:
        """A URL of the api service through its published port."""
        return f"http://127.0.0.1:{self.ingest_port}{path}"

    def state(self, container: str) -> dict[str, Any]:
        """The container's ``State`` (Status, ExitCode, Health, StartedAt, ...)."""
        state: dict[str, Any] = json.loads(self.docker.inspect(container, "{{json .State}}"))
        return state

    def wait_healthy(self, service: str, count: int, timeout: float = 180) -> list[str]:
        """Wait until ``count`` containers of the service run and are healthy; their ids."""
        deadline = time.monotonic() + timeout
        seen: dict[str, str] = {}
        while time.monotonic() < deadline:
            containers = self.compose.containers(service, running=False)
            seen = {c: self.status(c) for c in containers}
            exited = [c for c, s in seen.items() if s == "exited"]
            assert not exited, f"{service} exited:\n{self.compose.logs(service)}"
            healthy = [c for c, s in seen.items() if s == "healthy"]
            if len(healthy) == count and len(seen) == count:
                return healthy
            time.sleep(1)
        raise AssertionError(
            f"{service}: wanted {count} healthy, saw {seen}:\n{self.compose.logs(service)}"
        )

    def status(self, container: str) -> str:
        """``healthy``/``starting``/``unhealthy`` while running with a check, else the status."""
        state = self.state(container)
        if state["Status"] == "running" and state.get("Health"):
            return str(state["Health"]["Status"])
        return str(state["Status"])

    def events(self, container: str) -> list[dict[str, Any]]:
        """The JSON log events of one chassis container (LOG_FORMAT=json in the image)."""
        out = self.docker.run("logs", container).stdout
        events = []
        for line in out.splitlines():
            if line.startswith("{"):
                events.append(json.loads(line))
        return events

    def exec_python(self, container: str, code: str) -> str:
        """Run Python in a running container as its own user and environment; its stdout."""
        return self.docker.run("exec", container, "python", "-c", code).stdout
