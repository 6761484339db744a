"""compose.yaml against the real CLI, settings, Dockerfile, roles.sql and Prometheus config."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest
import yaml

from tests.deploy.files import (
    CONFIG,
    ROOT,
    SETTINGS_VARIABLES,
    chassis_services,
    check_cli_argv,
    dockerfile,
    duration_seconds,
    interpolate,
    service_command,
    service_env,
    services,
    start_command,
)
from tests.deploy.files import run_command as run_argv
from worker.settings import Settings

#: Seconds the daemon may need beyond SHUTDOWN_GRACE_SECONDS to stop (hand-back, flush, pool).
STOP_MARGIN = 20.0


def effective_env(name: str) -> dict[str, str]:
    """A chassis service's environment as the daemon sees it: the image's ENV, then compose's."""
    image_env = dockerfile().final_stage.env()
    return {**image_env, **service_env(chassis_services()[name])}


def settings_of(name: str) -> Settings:
    """The validated settings of a chassis service (compose defaults, no .env file)."""
    env = {k: v for k, v in effective_env(name).items() if k in SETTINGS_VARIABLES}
    return Settings(_env_file=None, **{k.lower(): v for k, v in env.items()})


def long_running() -> list[str]:
    """The chassis services that run the daemon (not one-shot commands)."""
    return [n for n, s in chassis_services().items() if service_command(s)[1:2] == ["run"]]


def test_compose_has_the_documented_services() -> None:
    """compose.yaml defines postgres, roles, migrate, api, worker and prometheus."""
    assert set(services()) == {"postgres", "roles", "migrate", "api", "worker", "prometheus"}
    assert set(chassis_services()) == {"migrate", "api", "worker"}
    assert sorted(long_running()) == ["api", "worker"]


def test_compose_commands_are_accepted_by_the_cli() -> None:
    """Every chassis service's command is a console script whose arguments the CLI parses."""
    expected = {"migrate": "migrate", "api": "run", "worker": "run"}
    for name, service in chassis_services().items():
        args = check_cli_argv(service_command(service))
        assert args.command == expected[name], name


def test_compose_environment_names_only_settings_and_validates() -> None:
    """Each variable a chassis service sets is a Settings field, and the whole set validates."""
    for name, service in chassis_services().items():
        unknown = set(service.get("environment") or {}) - SETTINGS_VARIABLES
        assert not unknown, f"{name} sets variables the daemon does not read: {sorted(unknown)}"
        settings = settings_of(name)
        assert settings.database_url is not None, f"{name} has no DATABASE_URL"


def test_compose_environment_validates_with_a_production_shell() -> None:
    """With secrets and the http downstream set in the shell, the worker's settings validate."""
    shell = {
        "CHASSIS_WORKER_PASSWORD": "s3cret",
        "USAGE_DOWNSTREAM": "http",
        "HUB_URL": "https://hub.example.com/v1/usage-events",
        "HUB_CLIENT_ID": "svc",
        "HUB_CLIENT_SECRET": "hub-secret",
        "AUDIT_RETENTION_DAYS": "90",
    }
    env = service_env(chassis_services()["worker"], shell)
    settings = Settings(_env_file=None, **{k.lower(): v for k, v in env.items()})
    assert settings.usage_downstream == "http"
    assert settings.hub_client_secret is not None
    assert settings.audit_retention_days == 90
    assert settings.database_url is not None
    assert "s3cret" in settings.database_url.get_secret_value()
    # Unset in the shell, a pass-through variable is not set at all (not set to "").
    assert "INGEST_TOKEN" not in service_env(chassis_services()["api"])
    token = service_env(chassis_services()["api"], {"INGEST_TOKEN": "t0ken"})["INGEST_TOKEN"]
    assert token == "t0ken"


def test_compose_service_roles() -> None:
    """api runs SERVICE_ROLE=api, worker runs SERVICE_ROLE=worker, and neither is overridden."""
    assert settings_of("api").service_role == "api"
    assert settings_of("worker").service_role == "worker"
    for name in long_running():
        args = check_cli_argv(service_command(chassis_services()[name]))
        assert args.role is None, f"{name}: --role would override SERVICE_ROLE"


def test_compose_ports_match_http_port() -> None:
    """The api publishes its HTTP_PORT on the host's loopback, and on another address and port
    when the shell says so; workers publish nothing and scale."""
    api = chassis_services()["api"]
    settings = settings_of("api")
    assert settings.http_host == "0.0.0.0"
    published = [interpolate(str(p), {}) for p in api.get("ports", [])]
    assert len(published) == 1
    address, host_port, container_port = published[0].split(":")
    assert int(container_port) == settings.http_port
    assert (address, host_port) == ("127.0.0.1", "8080")
    shell = {"CHASSIS_INGEST_ADDRESS": "0.0.0.0", "CHASSIS_INGEST_PORT": "9000"}
    assert interpolate(str(api["ports"][0]), shell) == f"0.0.0.0:9000:{settings.http_port}"
    for name in long_running():
        assert settings_of(name).http_host == "0.0.0.0", name
        assert settings_of(name).http_port in [int(p) for p in dockerfile_exposed()], name
    worker = chassis_services()["worker"]
    assert "ports" not in worker, "a published port would stop `--scale worker=N`"
    assert "container_name" not in worker


def dockerfile_exposed() -> list[str]:
    """The ports the image EXPOSEs."""
    return [p.split("/")[0] for e in dockerfile().final_stage.all("EXPOSE") for p in e.args.split()]


def test_compose_publishes_every_port_on_loopback_only() -> None:
    """With the defaults, every published port binds 127.0.0.1 (one rule for postgres, the api
    and Prometheus): nothing answers other machines unless the operator says so."""
    for name, service in services().items():
        for port in service.get("ports", []):
            assert interpolate(str(port), {}).startswith("127.0.0.1:"), (name, port)


def test_compose_worker_runs_two_replicas() -> None:
    """The worker service asks for two replicas by default."""
    assert chassis_services()["worker"]["deploy"]["replicas"] == 2


def test_compose_startup_order_and_postgres_health() -> None:
    """postgres is health-checked on a named volume; roles, then migrate, then api and worker."""
    all_services = services()
    postgres = all_services["postgres"]
    assert postgres["image"].startswith("postgres:16")
    check = " ".join(postgres["healthcheck"]["test"])
    assert "pg_isready" in check
    # Over TCP: the socket answers while the image's first-start init server still runs.
    assert re.search(r"pg_isready .*(-h|--host[= ])\s*127\.0\.0\.1\b", check), check
    volume = postgres["volumes"][0].split(":")[0]
    assert volume in (yaml.safe_load((ROOT / "compose.yaml").read_text())["volumes"] or {})
    depends = {name: s.get("depends_on", {}) for name, s in all_services.items()}
    assert depends["roles"]["postgres"]["condition"] == "service_healthy"
    assert depends["migrate"]["postgres"]["condition"] == "service_healthy"
    assert depends["migrate"]["roles"]["condition"] == "service_completed_successfully"
    for name in ("api", "worker"):
        assert depends[name]["migrate"]["condition"] == "service_completed_successfully"
    assert all_services["migrate"]["restart"] == "no"
    assert all_services["roles"]["restart"] == "no"


def test_compose_healthchecks() -> None:
    """Daemons keep the image's /healthz check (or probe /healthz); one-shot migrate has none."""
    image_check = " ".join(dockerfile().final_stage.json_instruction("HEALTHCHECK"))
    assert "/healthz" in image_check
    for name in long_running():
        service = chassis_services()[name]
        if "healthcheck" in service:
            assert "/healthz" in " ".join(service["healthcheck"]["test"]), name
    assert chassis_services()["migrate"]["healthcheck"] == {"disable": True}


def test_compose_builds_one_image_from_this_repository() -> None:
    """Every chassis service builds the same image tag from the repository's Dockerfile."""
    tags = set()
    for name, service in chassis_services().items():
        build = service["build"]
        context = ROOT / build["context"]
        assert context.resolve() == ROOT, name
        assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name
        assert (context / "pyproject.toml").is_file()
        tags.add(interpolate(service["image"], {}))
    assert len(tags) == 1, f"one image for every role, got {tags}"


def test_compose_stop_grace_covers_the_shutdown_grace() -> None:
    """Docker waits longer than SHUTDOWN_GRACE_SECONDS before SIGKILL, so drains finish."""
    for name in long_running():
        service = chassis_services()[name]
        grace = settings_of(name).shutdown_grace_seconds
        stop = duration_seconds(service["stop_grace_period"])
        assert stop >= grace + STOP_MARGIN, f"{name}: stop_grace_period {stop}s < {grace}s + margin"


def test_compose_migrate_installs_what_the_workers_install() -> None:
    """migrate and the workers agree on every variable the install reads (no unscheduling)."""
    migrate = service_env(chassis_services()["migrate"])
    worker = service_env(chassis_services()["worker"])
    install_vars = {
        "JOBS_SCHEMA",
        "AUDIT_RETENTION_DAYS",
        "ORPHAN_USER_RETENTION_HOURS",
        "SUPERADMIN_EMAILS",
        "PURGE_CRON",
        "CRON_TZ",
        "TOOL_JOBS",
        "USAGE_RETRY_LIMIT",
        "USAGE_RETRY_DELAY_SECONDS",
        "USAGE_HELD_DELAY_SECONDS",
        "DATABASE_URL",
    }
    for variable in install_vars:
        assert migrate.get(variable) == worker.get(variable), variable
    shell = {"AUDIT_RETENTION_DAYS": "30", "PURGE_CRON": "0 4 * * *", "JOBS_SCHEMA": "q"}
    assert {
        k: v for k, v in service_env(chassis_services()["migrate"], shell).items() if k in shell
    } == shell
    assert {
        k: v for k, v in service_env(chassis_services()["worker"], shell).items() if k in shell
    } == shell


def roles_sql_defaults() -> dict[str, str]:
    """The ``\\set`` defaults of config/roles.sql."""
    text = (CONFIG / "roles.sql").read_text()
    return dict(re.findall(r"^\s*\\set (\w+) (\w+)\s*$", text, flags=re.MULTILINE))


def test_compose_connects_with_the_least_privilege_roles() -> None:
    """api connects as the roles.sql api role, migrate and worker as its worker role, with the
    passwords and queue schema the roles service sets."""
    defaults = roles_sql_defaults()
    roles = services()["roles"]
    assert any(v.endswith(":/chassis/roles.sql:ro") for v in roles["volumes"])
    assert roles["volumes"][0].startswith("./config/roles.sql:")
    argv = [interpolate(str(a), {}) for a in roles["command"]]
    assert argv[0] == "psql"
    variables = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-v")
    assert variables["ON_ERROR_STOP"] == "1"
    assert argv[argv.index("-f") + 1] == "/chassis/roles.sql"
    expected_user = {
        "api": defaults["api_role"],
        "worker": defaults["worker_role"],
        "migrate": defaults["worker_role"],
    }
    password_var = {
        "api": "api_password",
        "worker": "worker_password",
        "migrate": "worker_password",
    }
    for name, user in expected_user.items():
        settings = settings_of(name)
        assert settings.database_url is not None
        url = urlsplit(settings.database_url.get_secret_value())
        assert url.username == user, name
        assert url.password == variables[password_var[name]], name
        assert url.hostname == "postgres"
        assert url.path.lstrip("/") == service_env(services()["roles"])["PGDATABASE"]
        assert settings.jobs_schema == variables["jobs_schema"], name


def test_compose_prometheus_scrapes_every_daemon() -> None:
    """Prometheus runs under the monitoring profile, mounts config/ files that exist, and scrapes
    each daemon service by its DNS name on its HTTP port."""
    prometheus = services()["prometheus"]
    assert prometheus["profiles"] == ["monitoring"]
    mounts = {}
    for volume in prometheus["volumes"]:
        source, target, *_ = volume.split(":")
        mounts[target] = source
    config_source = ROOT / mounts["/etc/prometheus/prometheus.yml"]
    assert config_source.resolve() == (CONFIG / "prometheus.yml").resolve()
    config = yaml.safe_load(config_source.read_text())
    config_dir = Path("/etc/prometheus/prometheus.yml").parent
    for rule_file in config["rule_files"]:
        mounted = str(config_dir / rule_file)
        assert mounted in mounts, f"rule file {rule_file} is not mounted"
        assert (ROOT / mounts[mounted]).is_file()
    targets: dict[str, set[int]] = {}
    for job in config["scrape_configs"]:
        if job.get("metrics_path", "/metrics") != "/metrics":
            continue
        for sd in job.get("dns_sd_configs", []):
            for dns_name in sd["names"]:
                targets.setdefault(dns_name, set()).add(int(sd["port"]))
        for static in job.get("static_configs", []):
            for target in static["targets"]:
                host, port = target.rsplit(":", 1)
                targets.setdefault(host, set()).add(int(port))
    for name in long_running():
        assert settings_of(name).http_port in targets.get(name, set()), f"{name} is not scraped"
        assert any(
            sd["type"] == "A" and name in sd["names"]
            for job in config["scrape_configs"]
            for sd in job.get("dns_sd_configs", [])
        ), f"{name} replicas are not discovered through DNS"


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_compose_commands_boot_on_a_real_database(empty_db_url: str, tmp_path) -> None:
    """Run as compose would, with each service's own command and environment (only the database,
    host and port swapped): migrate installs an empty database and exits 0, then the worker and
    the api become ready."""
    local = {"HTTP_HOST": "127.0.0.1", "DATABASE_POOL_SIZE": "4"}
    migrate = chassis_services()["migrate"]
    env = {**service_env(migrate), "DATABASE_URL": empty_db_url}
    done = await asyncio.to_thread(
        run_argv, service_command(migrate), env, database_url=empty_db_url, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "migrated" in done.stdout
    conn = await asyncpg.connect(empty_db_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM jobs.install") == 1
    finally:
        await conn.close()
    daemons = []
    try:
        for name in ("worker", "api"):
            service = chassis_services()[name]
            env = {**service_env(service), "DATABASE_URL": empty_db_url, **local}
            daemons.append(
                start_command(
                    service_command(service),
                    env,
                    tmp_path,
                    name=name,
                    database_url=empty_db_url,
                )
            )
        for daemon in daemons:
            await asyncio.to_thread(daemon.wait_ready, 30)
        worker, api = daemons
        assert any(e.get("event") == "worker.ready" for e in worker.events())
        assert any(e.get("event") == "api.ready" for e in api.events())
        for daemon in daemons:
            assert daemon.stop() == 0, daemon.logs()
    finally:
        for daemon in daemons:
            daemon.kill()
