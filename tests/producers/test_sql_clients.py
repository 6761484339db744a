"""The SQL functions from clients outside Python (contract section 11): ``psql`` and Node's
``pg``. For each, a send in a rolled-back transaction leaves no job, and a committed one is run
by a worker woken through NOTIFY: the worker polls only every 30 seconds, so a pickup well
before its next poll (the wait below gives up at 15 seconds) can only be the notification's.

Missing psql, node or npm (or an ``npm install pg`` that cannot reach its registry) skips
locally with the install hint and fails under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.support.ledger import create_ledger
from tests.support.processes import Daemon, start_daemon
from tests.support.tools import require_tool, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("processes")]

QUEUE = "tool-work"
#: The worker's fallback poll: far longer than the wait for a pickup.
POLL_SECONDS = 30
#: How long a pickup may take to count as woken by NOTIFY (half the poll).
PICKUP_WAIT_SECONDS = 15

NODE_SCRIPT = r"""
const { Client } = require("pg");

(async () => {
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  await client.query("BEGIN");
  await client.query("SELECT jobs.send($1, $2::jsonb)", [
    process.env.QUEUE, JSON.stringify({ via: "node-rollback" }),
  ]);
  await client.query("ROLLBACK");
  let unknown = null;
  try {
    await client.query("SELECT jobs.send('no-such-queue')");
  } catch (err) {
    unknown = err.code;
  }
  let invalid = null;
  try {
    await client.query("SELECT jobs.send($1, '{}', priority => NULL)", [process.env.QUEUE]);
  } catch (err) {
    invalid = [err.code, err.column];
  }
  await client.query("BEGIN");
  const sent = await client.query(
    "SELECT jobs.send($1, $2::jsonb, singleton_key => $3) AS id",
    [process.env.QUEUE, JSON.stringify({ via: "node" }), "from-node"],
  );
  await client.query("COMMIT");
  console.log(JSON.stringify({ id: sent.rows[0].id, unknown, invalid }));
  await client.end();
})().catch((err) => {
  console.error(err);
  process.exit(1);
});
"""


@pytest.fixture
async def worker(db_url: str, tmp_path: Path) -> AsyncIterator[Daemon]:
    """A worker running tool-work jobs (each run written to public.ledger), polling every 30 s."""
    await create_ledger(db_url)
    daemon = start_daemon(
        db_url,
        tmp_path / "worker",
        env={
            "TOOL_JOBS": "tests.support.tooljobs:WORK",
            "POLL_INTERVAL_SECONDS": str(POLL_SECONDS),
        },
    )
    try:
        await asyncio.to_thread(daemon.wait_ready, 60)
        yield daemon
    finally:
        daemon.stop()


async def wait_done(url: str, job_id: int, daemon: Daemon) -> None:
    """Wait for ``job_id`` to have run to its end, no longer than a pickup through NOTIFY takes."""
    deadline = time.monotonic() + PICKUP_WAIT_SECONDS
    conn = await asyncpg.connect(url)
    try:
        while time.monotonic() < deadline:
            done = await conn.fetchval(
                "SELECT count(*) FROM public.ledger WHERE job_id = $1 AND phase = 'done'", job_id
            )
            if done:
                return
            await asyncio.sleep(0.1)
    finally:
        await conn.close()
    pytest.fail(
        f"job {job_id} did not run within {PICKUP_WAIT_SECONDS} s of its commit: its NOTIFY "
        f"did not wake the worker (which polls every {POLL_SECONDS} s)\n{daemon.logs()[-3000:]}"
    )


async def nothing_rolled_back(url: str, via: str) -> None:
    """No job, and no run, of the rolled-back send."""
    conn = await asyncpg.connect(url)
    try:
        assert (
            await conn.fetchval("SELECT count(*) FROM jobs.job WHERE data->>'via' = $1", via) == 0
        )
        assert (
            await conn.fetchval("SELECT count(*) FROM public.ledger WHERE data->>'via' = $1", via)
            == 0
        )
    finally:
        await conn.close()


def psql(
    psql_path: str, url: str, *commands: str, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run ``commands`` (one -c each, one session) with psql; fail the test if psql fails."""
    argv = [psql_path, url, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1", "-v", "VERBOSITY=verbose"]
    for command in commands:
        argv += ["-c", command]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


async def test_psql_sends_in_its_own_transaction(db_url: str, worker: Daemon) -> None:
    """From psql: a rolled-back send leaves no job; a committed one runs at once (NOTIFY); an
    unknown queue is SQLSTATE P0002 naming it."""
    path = require_tool("psql", "postgresql-client")
    psql(
        path,
        db_url,
        "BEGIN",
        f"""SELECT jobs.send('{QUEUE}', '{{"via": "psql-rollback"}}')""",
        "ROLLBACK",
    )
    done = psql(
        path,
        db_url,
        "BEGIN",
        f"""SELECT jobs.send('{QUEUE}', '{{"via": "psql"}}', priority => 1)""",
        "COMMIT",
    )
    job_id = int(done.stdout.split()[0])
    await wait_done(db_url, job_id, worker)
    await nothing_rolled_back(db_url, "psql-rollback")
    refused = psql(path, db_url, "SELECT jobs.send('no-such-queue')", check=False)
    assert refused.returncode != 0
    assert "P0002" in refused.stderr
    assert "no-such-queue" in refused.stderr


async def test_node_pg_sends_in_its_own_transaction(
    db_url: str, worker: Daemon, tmp_path: Path
) -> None:
    """From Node's pg client: a rolled-back send leaves no job; a committed one runs at once
    (NOTIFY); the error codes are P0002 and 22023 naming the argument."""
    node = require_tool("node", "nodejs")
    npm = require_tool("npm", "npm", hint="or the Node.js 20 distribution, which brings npm")
    scratch = tmp_path / "node"
    scratch.mkdir()
    (scratch / "package.json").write_text('{"name": "sql-send-test", "private": true}')
    installed = await asyncio.to_thread(
        subprocess.run,
        [npm, "install", "--no-audit", "--no-fund", "--silent", "pg"],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if installed.returncode != 0:
        unavailable(
            f"`npm install pg` failed (is the npm registry reachable?): {installed.stderr[-500:]}"
        )
    (scratch / "send.js").write_text(NODE_SCRIPT)
    ran = await asyncio.to_thread(
        subprocess.run,
        [node, "send.js"],
        cwd=scratch,
        env={"DATABASE_URL": db_url, "QUEUE": QUEUE, "PATH": str(Path(node).parent)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr
    result = json.loads(ran.stdout.strip().splitlines()[-1])
    assert result["unknown"] == "P0002"
    assert result["invalid"] == ["22023", "priority"]
    job_id = int(result["id"])  # pg returns a bigint as a string
    await wait_done(db_url, job_id, worker)
    await nothing_rolled_back(db_url, "node-rollback")
