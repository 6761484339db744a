"""Booting: many replicas on a fresh database, the api role before any worker, bad config."""

from __future__ import annotations

import asyncio
import time
import uuid

import asyncpg
import pytest

from tests.support.processes import run_cli, start_daemon


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
@pytest.mark.parametrize("round_", range(5))
async def test_eight_workers_boot_at_once_on_a_fresh_database(
    empty_db_url: str, tmp_path, round_: int
) -> None:
    """8 workers started at the same instant: all ready, no deadlock, installed exactly once."""
    daemons = [
        start_daemon(
            empty_db_url,
            tmp_path,
            role="worker",
            name=f"w{i}",
            env={"DATABASE_POOL_SIZE": "2", "AUDIT_RETENTION_DAYS": "30"},
        )
        for i in range(8)
    ]
    try:
        for daemon in daemons:
            await asyncio.to_thread(daemon.wait_ready, 60)
        conn = await asyncpg.connect(empty_db_url)
        try:
            queues = await conn.fetch("SELECT name FROM jobs.queue ORDER BY name")
            assert [q["name"] for q in queues] == [
                "apikey-expiry-sweep",
                "audit-purge",
                "idempotency-purge",
                "orphan-user-purge",
                "usage-events",
                "usage-events-held",
            ]
            schedules = await conn.fetch("SELECT queue FROM jobs.schedule ORDER BY queue")
            assert [s["queue"] for s in schedules] == [
                "apikey-expiry-sweep",
                "audit-purge",
                "idempotency-purge",
            ]
            dead_letter = await conn.fetchval(
                "SELECT dead_letter FROM jobs.queue WHERE name = 'usage-events'"
            )
            assert dead_letter == "usage-events-held"
        finally:
            await conn.close()
        for daemon in daemons:
            assert "deadlock" not in daemon.logs().lower()
    finally:
        for daemon in daemons:
            daemon.kill()


@pytest.mark.slow
@pytest.mark.xdist_group("processes")
async def test_api_waits_for_the_install_and_needs_no_ddl_rights(
    empty_db_url: str, admin_url: str, tmp_path
) -> None:
    """An api process on an empty database, as a role without CREATE, is ready only after a
    worker installs, and gets there by itself."""
    role = f"chassis_t_api_{uuid.uuid4().hex[:8]}"
    dbname = empty_db_url.rsplit("/", 1)[1]
    admin = await asyncpg.connect(admin_url)
    owner = await asyncpg.connect(empty_db_url)
    await admin.execute(f"CREATE ROLE {role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
    try:
        await admin.execute(f'REVOKE CREATE, TEMPORARY ON DATABASE "{dbname}" FROM PUBLIC')
        # What an operator's roles.sql does: future tables of the installer are usable.
        await owner.execute(f"ALTER DEFAULT PRIVILEGES GRANT USAGE ON SCHEMAS TO {role}")
        await owner.execute(
            f"ALTER DEFAULT PRIVILEGES GRANT SELECT, INSERT, UPDATE ON TABLES TO {role}"
        )
        await owner.execute(f"ALTER DEFAULT PRIVILEGES GRANT USAGE ON SEQUENCES TO {role}")
        api_url = empty_db_url.replace("://postgres@", f"://{role}@")
        api = start_daemon(api_url, tmp_path, role="api", name="api")
        try:
            deadline = time.monotonic() + 20
            status, body = 0, None
            while time.monotonic() < deadline:
                status, body = api.get("/readyz")
                if status == 503 and body["reason"] != "starting":
                    break
                await asyncio.sleep(0.1)
            assert (status, body) == (503, {"ready": False, "reason": "schema not installed"})
            await asyncio.sleep(1.5)
            assert api.get("/readyz")[0] == 503
            assert api.get("/healthz")[0] == 200
            worker = start_daemon(empty_db_url, tmp_path, role="worker", name="worker")
            try:
                await asyncio.to_thread(worker.wait_ready, 60)
                await asyncio.to_thread(api.wait_ready, 30)
                assert api.process.poll() is None
                assert "permission denied" not in api.logs()
            finally:
                worker.kill()
        finally:
            api.kill()
    finally:
        await owner.close()
        await admin.execute(f'DROP DATABASE IF EXISTS "{dbname}" WITH (FORCE)')
        await admin.execute(f"DROP ROLE IF EXISTS {role}")
        await admin.close()


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"SERVICE_ROLE": "boss"}, "SERVICE_ROLE"),
        ({"AUDIT_RETENTION_DAYS": "-1"}, "AUDIT_RETENTION_DAYS"),
        ({"PURGE_CRON": "every night"}, "PURGE_CRON"),
        ({"USAGE_DOWNSTREAM": "http"}, "HUB_URL"),
        ({"CRON_TZ": "Mars/Olympus"}, "CRON_TZ"),
        ({"TOOL_JOBS": "tests.support.nope:JOBS"}, "TOOL_JOBS"),
        ({"TOOL_JOBS": "tests.support.tooljobs:MISSING"}, "TOOL_JOBS"),
        ({"TOOL_JOBS": "no_colon_here"}, "TOOL_JOBS"),
        ({"JOBS_SCHEMA": "Robert'); DROP TABLE"}, "JOBS_SCHEMA"),
    ],
)
def test_invalid_configuration_exits_2_with_one_line(db_url: str, tmp_path, env, names) -> None:
    """A bad variable: exit 2, one line on stderr naming it, no traceback."""
    result = run_cli(db_url, "run", env={"HTTP_PORT": "0", **env}, cwd=tmp_path, timeout=30)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert names in lines[0]
    assert "Traceback" not in result.stderr


def test_send_and_queues_commands(db_url: str, tmp_path) -> None:
    """`send` prints the new id; `queues --json` shows it waiting; bad JSON exits 2."""
    assert run_cli(db_url, "migrate", cwd=tmp_path).returncode == 0
    event = '{"meter": "m", "quantity": 1, "workspace_id": "w"}'
    sent = run_cli(db_url, "send", "usage-events", event, cwd=tmp_path)
    assert sent.returncode == 0, sent.stderr
    job_id = int(sent.stdout.strip())
    assert job_id > 0
    report = run_cli(db_url, "queues", "--json", cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    import json

    queues = {q["name"]: q for q in json.loads(report.stdout)["queues"]}
    usage = queues["usage-events"]
    assert usage["counts"] == {
        "created": 1,
        "retry": 0,
        "active": 0,
        "completed": 0,
        "cancelled": 0,
        "failed": 0,
    }
    assert usage["oldest_waiting_seconds"] is not None
    assert queues["audit-purge"]["oldest_waiting_seconds"] is None
    bad = run_cli(db_url, "send", "usage-events", "{not json", cwd=tmp_path)
    assert bad.returncode == 2
    assert "JSON" in bad.stderr
    missing = run_cli(db_url, "send", "no-such-queue", "{}", cwd=tmp_path)
    assert missing.returncode == 2
    assert "no-such-queue" in missing.stderr
