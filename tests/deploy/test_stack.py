"""The real image on the real compose file (RELIABILITY.md drill 22).

The project's Dockerfile is built as it is (by docker-compose with the legacy builder, and by
BuildKit), and compose.yaml runs on a fresh volume whose first init is slow. Base images come
from Docker Hub when present, else from the Debian stand-ins (tests/deploy/standin_images.py);
the postgres stand-in runs Debian 12's PostgreSQL 15, and the test says which server it met.

Run by `make deploy-test` (and .ci/deploy, which starts a Docker daemon for it); `make test`
leaves it out. The tests share one stack and run in file order: it comes up, serves, scales to
four workers, then one worker is stopped while it runs a job.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime

import asyncpg
import pytest

from tests.deploy.dockercli import Docker
from tests.deploy.files import ROOT
from tests.deploy.stack import INGEST_TOKEN, SLOW_INIT_SECONDS, Stack
from tests.deploy.standin_images import ensure_standins

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

#: Image build timeout: pip downloads and installs every dependency in the build stage.
BUILD_TIMEOUT = 900


@pytest.fixture(scope="module")
def note(pytestconfig: pytest.Config) -> Callable[[str], None]:
    """Print one line of what the deploy test found, past pytest's output capture."""
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            print(f"\ndeploy: {line}", flush=True)

    return say


@pytest.fixture(scope="module")
def docker(tmp_path_factory: pytest.TempPathFactory, note: Callable[[str], None]) -> Docker:
    """A docker client whose daemon answers and has both base images (real or stand-ins)."""
    client = Docker.connect()
    note(f"docker {client.run('version', '--format', '{{.Server.Version}}').stdout.strip()}")
    ensure_standins(client, tmp_path_factory.mktemp("standins"), note)
    return client


@pytest.fixture(scope="module")
def stack(
    docker: Docker, tmp_path_factory: pytest.TempPathFactory, note: Callable[[str], None]
) -> Iterator[Stack]:
    """compose.yaml built and up on a fresh volume (a slow first init), torn down afterwards."""
    workdir = tmp_path_factory.mktemp("stack")
    stack = Stack.create(docker, workdir, note)
    compose = stack.compose
    compose.run("down", "--volumes", "--remove-orphans", "--timeout", "5")
    try:
        began = time.monotonic()
        compose.run("build", timeout=BUILD_TIMEOUT)
        size = int(docker.run("image", "inspect", "--format", "{{.Size}}", stack.image).stdout)
        note(f"{stack.image} built in {time.monotonic() - began:.0f} s, {size / 1e6:.0f} MB")
        up = compose.run("up", "--detach", check=False, timeout=600)
        assert up.returncode == 0, (
            f"docker-compose up failed:\n{up.stdout}{up.stderr}\n"
            f"{compose.run('logs', '--no-color', 'postgres', 'roles', 'migrate').stdout}"
        )
        yield stack
    finally:
        (workdir / "compose.log").write_text(compose.run("logs", "--no-color", check=False).stdout)
        compose.run("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False)


def exit_code(stack: Stack, service: str) -> int:
    """The exit code of a one-shot service's (only) container, once it exited."""
    (container,) = stack.compose.containers(service, running=False)
    state = stack.state(container)
    assert state["Status"] == "exited", f"{service} is {state['Status']}"
    return int(state["ExitCode"])


def log_time(stack: Stack, service: str, text: str) -> datetime:
    """When a service's container first logged a line containing ``text``."""
    (container,) = stack.compose.containers(service, running=False)
    out = stack.docker.run("logs", "--timestamps", container)
    for line in (out.stdout + out.stderr).splitlines():
        stamp, _, message = line.partition(" ")
        if text in message:
            return parse_time(stamp)
    raise AssertionError(f"{service} never logged {text!r}")


def parse_time(stamp: str) -> datetime:
    """Docker's RFC 3339 timestamp (nanoseconds) as a datetime."""
    whole, _, fraction = stamp.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{whole}.{(fraction + '000000')[:6]}+00:00")


def ready(stack: Stack, container: str) -> int:
    """The HTTP status of /readyz inside a chassis container."""
    code = (
        "import urllib.request, urllib.error\n"
        "try:\n"
        "    print(urllib.request.urlopen('http://127.0.0.1:8080/readyz', timeout=5).status)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print(e.code)\n"
    )
    return int(stack.exec_python(container, code))


async def test_fresh_volume_with_a_slow_first_init_comes_up_in_order(stack: Stack) -> None:
    """On a fresh volume whose first init is slow, roles starts only once the real server
    answers, roles and migrate exit 0, and the api and two workers become healthy and ready."""
    init_done = log_time(stack, "postgres", "first-start initialisation done")
    (roles,) = stack.compose.containers("roles", running=False)
    roles_started = parse_time(stack.state(roles)["StartedAt"])
    assert roles_started > init_done, "roles started while the first-start init was running"
    assert exit_code(stack, "roles") == 0
    assert exit_code(stack, "migrate") == 0
    (api,) = stack.wait_healthy("api", 1)
    workers = stack.wait_healthy("worker", 2)
    for container in (api, *workers):
        assert ready(stack, container) == 200
    with urllib.request.urlopen(stack.ingest_url("/readyz"), timeout=5) as response:
        assert json.loads(response.read())["ready"] is True
    conn = await asyncpg.connect(stack.superuser_url())
    try:
        version = await conn.fetchval("SELECT current_setting('server_version')")
    finally:
        await conn.close()
    stack.note(f"PostgreSQL {version}; first init held {SLOW_INIT_SECONDS} s")


def test_image_holds_only_the_installed_daemon(stack: Stack) -> None:
    """The image runs as uid 10001 and carries no wheels, sources or compiler."""
    code = (
        "import os, shutil, json; print(json.dumps({'uid': os.getuid(), "
        "'left': [p for p in ('/wheels', '/src') if os.path.exists(p)], "
        "'gcc': shutil.which('gcc'), 'daemon': shutil.which('chassis-worker')}))"
    )
    found = json.loads(stack.docker.run("run", "--rm", stack.image, "python", "-c", code).stdout)
    assert found["uid"] == 10001
    assert found["left"] == []
    assert found["gcc"] is None
    assert found["daemon"] == "/opt/chassis/bin/chassis-worker"


async def test_usage_event_goes_end_to_end(stack: Stack) -> None:
    """An event posted to the published ingest port is enqueued by the api and delivered by a
    worker (USAGE_DOWNSTREAM=log: the batch is logged and the job completes)."""
    event = {
        "meter": "deploy.test",
        "quantity": 1,
        "workspace_id": "w-deploy",
        "occurred_at": datetime.now(UTC).isoformat(),
    }
    request = urllib.request.Request(
        stack.ingest_url("/v1/usage-events"),
        data=json.dumps(event).encode(),
        headers={"Authorization": f"Bearer {INGEST_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 202
        (event_id,) = json.loads(response.read())["ids"]
    delivered = None
    for _ in range(60):
        for container in stack.compose.containers("worker"):
            for line in stack.events(container):
                ids = [e.get("id") for e in line.get("events", [])]
                if line.get("event") == "usage.logged" and event_id in ids:
                    delivered = container
        if delivered:
            break
        await asyncio.sleep(1)
    assert delivered, f"no worker delivered {event_id}"
    conn = await asyncpg.connect(stack.superuser_url())
    try:
        states = await conn.fetch(
            "SELECT state::text FROM jobs.job WHERE queue = 'usage-events' AND data::text LIKE $1",
            f"%{event_id}%",
        )
    finally:
        await conn.close()
    assert [r["state"] for r in states] == ["completed"]


def test_api_role_cannot_delete(stack: Stack) -> None:
    """Inside the api container, with the api's own DATABASE_URL, a SELECT on the queue works
    and a DELETE is refused for lack of privilege."""
    (api,) = stack.compose.containers("api")
    code = (
        "import asyncio, os, json, asyncpg\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(os.environ['DATABASE_URL'])\n"
        "    out = {'user': await conn.fetchval('SELECT current_user'),\n"
        "           'count': await conn.fetchval('SELECT count(*) FROM jobs.job')}\n"
        "    try:\n"
        "        await conn.execute('DELETE FROM jobs.job WHERE false')\n"
        "        out['delete'] = 'allowed'\n"
        "    except asyncpg.PostgresError as e:\n"
        "        out['delete'] = e.sqlstate\n"
        "    await conn.close()\n"
        "    print(json.dumps(out))\n"
        "asyncio.run(main())\n"
    )
    found = json.loads(stack.exec_python(api, code))
    assert found["user"] == "chassis_api"
    assert found["count"] >= 1
    assert found["delete"] == "42501", found  # insufficient_privilege


def test_workers_scale_to_four(stack: Stack) -> None:
    """`up --scale worker=4` brings four healthy, ready workers."""
    stack.compose.run("up", "--detach", "--scale", "worker=4", timeout=600)
    workers = stack.wait_healthy("worker", 4)
    assert [ready(stack, c) for c in workers] == [200] * 4


async def test_stopped_worker_hands_its_running_job_back_and_exits_0(stack: Stack) -> None:
    """`docker stop` of the worker running a job that outlasts the grace: the worker drains,
    hands the job back without counting a failure, exits 0 within compose's stop_grace_period,
    and another worker picks the job up."""
    (sender, *_) = stack.compose.containers("worker")
    sent = stack.docker.run(
        "exec", sender, "chassis-worker", "send", "deploy-sleep", '{"seconds": 600}'
    )
    job_id = int(sent.stdout.split()[-1])
    workers = stack.compose.containers("worker")
    hosts = {stack.docker.inspect(c, "{{.Config.Hostname}}"): c for c in workers}
    conn = await asyncpg.connect(stack.superuser_url())
    try:
        holder = await held_by(conn, job_id, timeout=60)
        container = hosts[holder]
        began = time.monotonic()
        stack.docker.run("stop", container, timeout=120)
        took = time.monotonic() - began
        state = stack.state(container)
        assert state["ExitCode"] == 0, stack.docker.run("logs", container).stdout
        events = [e["event"] for e in stack.events(container) if "event" in e]
        handed = [
            e for e in stack.events(container)
            if e.get("event") == "job.handed_back" and e.get("job_id") == job_id
        ]  # fmt: skip
        assert handed, events
        assert "shutdown.done" in events
        stack.note(f"worker stopped in {took:.0f} s, exit 0, job {job_id} handed back")
        new_holder = await held_by(conn, job_id, timeout=60)
        assert new_holder != holder
        row = await conn.fetchrow("SELECT retry_count, attempt FROM jobs.job WHERE id = $1", job_id)
        assert row["retry_count"] == 0, "a hand-back counted as a failure"
        assert row["attempt"] == 2
    finally:
        await conn.close()


async def held_by(conn: asyncpg.Connection, job_id: int, *, timeout: float) -> str:
    """The host name (container) of the worker holding the job, once one holds it and beats."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        host = await conn.fetchval(
            "SELECT w.host FROM jobs.job j JOIN jobs.worker w ON w.id = j.locked_by"
            " WHERE j.id = $1 AND j.state = 'active'",
            job_id,
        )
        if host:
            return str(host)
        await asyncio.sleep(0.5)
    raise AssertionError(f"no worker holds job {job_id}")


def test_dockerfile_builds_with_buildkit_too(docker: Docker, note: Callable[[str], None]) -> None:
    """The unmodified Dockerfile builds with the engine's own BuildKit as well (no frontend to
    fetch, base images from the local store), into an image whose CLI runs."""
    image = "chassis-worker:deploy-test-buildkit"
    began = time.monotonic()
    docker.run(
        "build", "--tag", image, str(ROOT), env={"DOCKER_BUILDKIT": "1"}, timeout=BUILD_TIMEOUT
    )
    note(f"BuildKit build in {time.monotonic() - began:.0f} s")
    usage = docker.run("run", "--rm", image, "chassis-worker", "--help").stdout
    assert "migrate" in usage
