"""Reading the deployment files the way Docker, Compose and psql read them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import Daemon, base_env, free_port
from worker.commands.arguments import build_parser
from worker.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CONFIG = ROOT / "config"
ROLES_SQL = CONFIG / "roles.sql"

#: Environment variables the image may set that are not the daemon's.
NON_SETTINGS_ENV = {
    "PATH",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PIP_NO_CACHE_DIR",
    "PIP_DISABLE_PIP_VERSION_CHECK",
}

SETTINGS_VARIABLES = {name.upper() for name in Settings.model_fields}


def pyproject() -> dict[str, Any]:
    """The parsed pyproject.toml."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def console_scripts() -> dict[str, str]:
    """Console scripts the package installs, name to entry point."""
    scripts: dict[str, str] = pyproject()["project"]["scripts"]
    return scripts


def check_cli_argv(argv: list[str]) -> Any:
    """Parse ``argv`` (a console script and its arguments) like the installed CLI would.

    Fails the test when the script is not one the package installs or argparse refuses the rest.
    """
    assert argv, "empty command"
    assert argv[0] in console_scripts(), f"{argv[0]!r} is not a console script of this package"
    try:
        return build_parser().parse_args(argv[1:])
    except SystemExit as exc:  # argparse exits 2 on a bad command line
        raise AssertionError(f"chassis-worker refuses the command line {argv!r}") from exc


# --- Compose ---------------------------------------------------------------------------------

_VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)


def interpolate(value: str, env: Mapping[str, str]) -> str:
    """Compose's variable interpolation: ``$$``, ``$V``, ``${V}``, ``${V:-d}``, ``${V-d}``,
    ``${V:?e}`` and ``${V?e}``."""

    def replace(match: re.Match[str]) -> str:
        if match["escaped"]:
            return "$"
        name = match["braced"] or match["bare"]
        current = env.get(name)
        op = match["op"]
        if op in (":-", "-"):
            unset = current is None or (op == ":-" and current == "")
            return match["arg"] if unset else str(current)
        if op in (":?", "?"):
            unset = current is None or (op == ":?" and current == "")
            if unset:
                raise AssertionError(f"compose requires {name}: {match['arg']}")
            return str(current)
        return current or ""

    return _VARIABLE.sub(replace, value)


def load_compose() -> dict[str, Any]:
    """compose.yaml as YAML (anchors and merge keys resolved, variables not yet)."""
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def services() -> dict[str, dict[str, Any]]:
    """The services of compose.yaml."""
    result: dict[str, dict[str, Any]] = load_compose()["services"]
    return result


def built_here(service: dict[str, Any]) -> bool:
    """Whether the service runs the image built from this repository."""
    return "build" in service


def chassis_services() -> dict[str, dict[str, Any]]:
    """The services that run this repository's image."""
    return {name: s for name, s in services().items() if built_here(s)}


def service_env(service: dict[str, Any], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The container environment of a service with ``env`` as the shell (default: empty).

    A variable listed without a value is taken from the shell and left unset when absent.
    """
    shell = dict(env or {})
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) if "=" in item else (item, None) for item in raw)
    result: dict[str, str] = {}
    for name, value in raw.items():
        if value is None:
            if name in shell:
                result[name] = shell[name]
            continue
        result[name] = interpolate(str(value), shell)
    return result


def service_command(service: dict[str, Any], env: Mapping[str, str] | None = None) -> list[str]:
    """The service's command as an argv list, interpolated (the image's CMD when absent)."""
    command = service.get("command")
    if command is None:
        return dockerfile().final_stage.json_instruction("CMD")
    assert isinstance(command, list), "write commands in exec form (a YAML list)"
    return [interpolate(str(part), dict(env or {})) for part in command]


def duration_seconds(value: str) -> float:
    """A compose duration such as ``1m30s`` or ``50s`` in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", value)
    assert parts, f"bad duration {value!r}"
    assert "".join(n + u for n, u in parts) == value, f"bad duration {value!r}"
    return sum(float(n) * units[u] for n, u in parts)


# --- Dockerfile ------------------------------------------------------------------------------


@dataclass
class Instruction:
    """One Dockerfile instruction with its raw argument text."""

    keyword: str
    args: str


@dataclass
class Stage:
    """One FROM ... stage."""

    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        """Every instruction of this kind, in order."""
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        """The effective (last) instruction of this kind."""
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]

    def json_instruction(self, keyword: str) -> list[str]:
        """The exec-form (JSON array) argument of the last such instruction."""
        args = self.last(keyword).args
        if keyword == "HEALTHCHECK":
            args = re.sub(r"^(--[a-z-]+=\S+\s+)*CMD\s+", "", args)
        value = json.loads(args)
        assert isinstance(value, list)
        assert all(isinstance(v, str) for v in value)
        return value

    def env(self) -> dict[str, str]:
        """Every ENV set in this stage (``ENV A=1 B=2`` form)."""
        result: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for pair in instruction.args.split():
                name, _, value = pair.partition("=")
                result[name] = value
        return result


@dataclass
class Dockerfile:
    """The parsed Dockerfile: global ARGs and the stages in order."""

    args: dict[str, str]
    stages: list[Stage]

    @property
    def final_stage(self) -> Stage:
        """The stage the image is made of."""
        return self.stages[-1]


def dockerfile(path: Path = DOCKERFILE) -> Dockerfile:
    """Parse a Dockerfile: comments, line continuations, global ARGs, stages."""
    logical: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    assert not pending, "the Dockerfile ends inside a line continuation"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            words = rest.split()
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m[1], ""), words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name))
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            name, _, default = rest.partition("=")
            args[name] = default
        else:
            stages[-1].instructions.append(Instruction(keyword, rest))
    return Dockerfile(args, stages)


def dockerignore_patterns() -> list[str]:
    """The exclusion patterns of .dockerignore (comments and blanks dropped)."""
    lines = DOCKERIGNORE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def dockerignored(path: str) -> bool:
    """Whether Docker leaves ``path`` (relative to the context) out of the build context."""
    from fnmatch import fnmatch

    excluded = False
    parts = Path(path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in dockerignore_patterns():
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").strip("/")
        bare = pattern.removeprefix("**/")
        if any(fnmatch(p, pattern) or fnmatch(Path(p).name, bare) for p in prefixes):
            excluded = not negate
    return excluded


# --- example.env -----------------------------------------------------------------------------

_ASSIGNMENT = re.compile(r"^(?P<commented># )?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


@dataclass
class EnvEntry:
    """One variable of config/example.env."""

    name: str
    value: str
    commented: bool
    description: str | None


def example_env(path: Path = CONFIG / "example.env") -> list[EnvEntry]:
    """Every ``NAME=value`` or ``# NAME=value`` line, with the comment line right above it."""
    entries: list[EnvEntry] = []
    previous: str | None = None
    for line in path.read_text().splitlines():
        match = _ASSIGNMENT.match(line)
        if match:
            description = None
            if previous and previous.startswith("# ") and not _ASSIGNMENT.match(previous):
                description = previous[2:].strip()
            entries.append(
                EnvEntry(match["name"], match["value"], bool(match["commented"]), description)
            )
        previous = line
    return entries


# --- processes -------------------------------------------------------------------------------


def console_script(name: str) -> str:
    """The installed console script ``name`` next to this interpreter."""
    path = Path(sys.executable).parent / name
    assert path.exists(), f"console script {name} is not installed in {path.parent}"
    return str(path)


def start_command(
    argv: list[str], env: Mapping[str, str], log_dir: Path, *, name: str, database_url: str
) -> Daemon:
    """Start ``argv`` (its console script resolved in this venv) as a daemon on a free port."""
    port = free_port()
    full_env = base_env(database_url, **{**dict(env), "HTTP_PORT": str(port)})
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}-{port}.log"
    with log_path.open("wb") as handle:
        process = subprocess.Popen(
            [console_script(argv[0]), *argv[1:]],
            env=full_env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            cwd=log_dir,
        )
    return Daemon(process, port, log_path, full_env)


def run_command(
    argv: list[str], env: Mapping[str, str], *, database_url: str, cwd: Path, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` (its console script resolved in this venv) to completion."""
    return subprocess.run(
        [console_script(argv[0]), *argv[1:]],
        env=base_env(database_url, **dict(env)),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )
