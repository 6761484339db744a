"""The docker and docker-compose command lines the deploy test drives.

The docker client is Debian's (/usr/bin/docker, from docker.io) unless ``CHASSIS_DOCKER`` names
another: it matches Debian's dockerd and docker-compose 1.29, and its `docker build` is the
legacy builder. Another client earlier on PATH (a 28.x without the buildx plugin) would build
differently or refuse to, and docker-compose 1.29 runs whichever `docker` comes first on PATH for
`build`, so that client's directory goes first on PATH for every command here.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tests.support.tools import require_tool, unavailable

#: Debian's docker.io client.
DEBIAN_DOCKER = Path("/usr/bin/docker")


def docker_client() -> str:
    """The docker client to drive: ``CHASSIS_DOCKER``, else Debian's, else the one on PATH."""
    chosen = os.environ.get("CHASSIS_DOCKER")
    if chosen:
        return chosen
    if DEBIAN_DOCKER.exists():
        return str(DEBIAN_DOCKER)
    return require_tool("docker", "docker.io")


def failure(done: subprocess.CompletedProcess[str]) -> str:
    """A failed command's line, exit status and output, for an assertion message."""
    args = " ".join(str(a) for a in done.args)
    return f"`{args}` exited {done.returncode}:\n{done.stdout}{done.stderr}"


@dataclass
class Docker:
    """One docker client against one daemon (``DOCKER_HOST`` or the default socket)."""

    binary: str
    env: dict[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def connect(cls) -> Docker:
        """The client, once its daemon answers; :func:`unavailable` otherwise."""
        binary = docker_client()
        path = f"{Path(binary).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        docker = cls(binary, {**os.environ, "PATH": path})
        version = docker.run("version", "--format", "{{.Server.Version}}", check=False)
        if version.returncode != 0:
            where = os.environ.get("DOCKER_HOST", "the default socket")
            unavailable(
                f"no Docker daemon answers at {where} ({version.stderr.strip()}): start one, or "
                "run `bash .ci/deploy`, which starts its own"
            )
        return docker

    def run(
        self,
        *args: str,
        program: str | None = None,
        check: bool = True,
        timeout: float = 120,
        input: str | None = None,
        stdin: IO[Any] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker ARGS`` (or ``program ARGS``) with this client first on PATH; unless
        ``check`` is false, fail the test when it fails."""
        argv = [program or self.binary, *args]
        done = subprocess.run(
            argv,
            env={**self.env, **(env or {})},
            input=input,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0 or not check, failure(done)
        return done

    def image_label(self, image: str, label: str) -> str | None:
        """The image's value of ``label`` ("" when it has none), or None when there is no image."""
        done = self.run(
            "image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', image,
            check=False,
        )  # fmt: skip
        if done.returncode != 0:
            return None
        value = done.stdout.strip()
        return "" if value == "<no value>" else value

    def inspect(self, container: str, template: str) -> str:
        """One ``docker inspect --format`` value of a container."""
        return self.run("inspect", "--format", template, container).stdout.strip()


@dataclass
class Compose:
    """docker-compose 1.x on one project: compose.yaml plus the test's override file."""

    docker: Docker
    project: str
    files: list[Path]
    env: dict[str, str]
    options: list[str] = field(default_factory=list)

    @property
    def binary(self) -> str:
        """The docker-compose executable."""
        return require_tool("docker-compose", "docker-compose")

    def run(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """Run ``docker-compose ARGS`` on the project; unless ``check``, fail when it fails."""
        argv = ["--ansi", "never", "--project-name", self.project]
        for file in self.files:
            argv += ["--file", str(file)]
        argv += ["--project-directory", str(self.files[0].parent), *self.options, *args]
        return self.docker.run(
            *argv, program=self.binary, check=check, timeout=timeout, env=self.env
        )

    def containers(self, service: str, *, running: bool = True) -> list[str]:
        """The ids of the service's containers, oldest first (only running ones by default)."""
        filters = [
            f"label=com.docker.compose.project={self.project}",
            f"label=com.docker.compose.service={service}",
            *(["status=running"] if running else []),
        ]
        args = [arg for f in filters for arg in ("--filter", f)]
        listed = self.docker.run("ps", "--all", "--no-trunc", "--format", "{{.ID}}", *args)
        return list(reversed(listed.stdout.split()))

    def logs(self, service: str) -> str:
        """Every log line of the service's containers so far."""
        return self.run("logs", "--no-color", service).stdout
