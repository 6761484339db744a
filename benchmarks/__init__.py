"""``make bench``: the queue engine's figures, each next to its target and to pgqueuer's.

How to read the output
----------------------

Every figure is measured in this sitting, on a fresh scratch database on 127.0.0.1:5432 that is
created for it and dropped after it, five times (``RUNS``), the runs of the figures interleaved;
the figure shown is the median of the five runs (the raw values follow in brackets: the
spread). The machine has 2 cores shared by PostgreSQL, the worker, the benchmark itself and
whoever else runs tests right now, so figures are noisy: a single run that misses a target by a
few percent means little, a median that misses it by a factor means a lot.

* ``send_many``: jobs/s of ``Sender.send_many`` with 20,000 jobs in one call, and with the same
  20,000 sent as 20 sequential calls of 1,000 (pgqueuer's and pg-boss's way of measuring).
* ``send``: latency of one ``Sender.send``, awaited in sequence (5,000 sends after a warm-up);
  p50 and p99 in milliseconds. It includes the commit (``synchronous_commit`` as the server has
  it).
* ``pgqueuer enqueue``: the same two producer figures for pgqueuer in this sitting
  (``Queries.enqueue`` on one asyncpg connection: 20,000 jobs in calls of 1,000, then 5,000
  single enqueues), and the floor: a one-row INSERT into a bare table, timed like a send. No
  durable send can beat the floor; it tells how fast this machine's disk commits today. Beside
  it, the same one-row INSERT straight into ``jobs.job`` (the row a send writes, without the
  function or the NOTIFY): the job table's own share of a send's ratio to the floor.
* ``drain``: 60,000 no-op jobs sent before one real worker process (``python -m worker run``,
  ``SERVICE_ROLE=worker``, ``TOOL_JOBS=benchmarks.noop:DRAIN``: batch_size 200, concurrency
  400, so a second batch is claimed while the first runs) starts; jobs/s from the first claim to
  the last completion, both read from the database (``min(started_at)`` to
  ``max(completed_at)``), so process start-up is not counted. The queue table is vacuumed and
  analysed after the fill, on both sides.
* ``pgqueuer drain``: the same 60,000 jobs drained by pgqueuer (PyPI, separate venv under
  ``benchmarks/.peers/``) through ``pgqueuer.run(...)`` with a no-op entrypoint and batch 50,
  timed the same way from its log table (first ``picked`` to last ``successful``). The ratio
  ``drain / pgqueuer drain`` is computed per run, then the median is taken.
* ``graphile-worker``: graphile-worker 0.18.x from the npm registry, installed on first use into
  ``benchmarks/.peers/graphile-worker`` (``npm install``; Node 20) and driven by our own Node
  script ``benchmarks/graphile_peer.mjs`` (copied there, since Node resolves the package from the
  script's directory), each figure on a fresh database of its own: the drain of the same 60,000
  no-op jobs in one ``run()`` process, with its documented batched settings (``localQueue.size
  500``, ``completeJobBatchDelay 0``, ``failJobBatchDelay 0``, ``concurrentJobs 24``,
  ``maxPoolSize 25``) and with its defaults, timed from the first task's first line to an empty
  job table (it deletes a job when it completes; polled every 20 ms); ``addJobs`` of 20,000 in one
  call and in calls of 1,000; ``addJob`` p50/p99 in sequence; pickup as ours. The batched drain
  takes its turn in the same rotation as ours and pgqueuer's; ratios are ours / graphile's, run by
  run.
* ``SQL-only ceiling``: ``benchmarks/ceiling.py``, pgbench running our claim and complete
  statements (built from ``worker.queue.sql``'s pieces) with no worker at batch 200 on a bare copy
  of the job table (primary key and ``job_fetch`` only, no trigger), as complete-and-claim in one
  statement and as claim then complete, with 1 and 2 clients; the fastest of the four is the
  ceiling, and ``drain / ceiling`` says how close the worker gets to what the database allows.
  The same four runs on the real ``jobs.job`` of an installed schema (every index and the
  finished-job counters) give a second ceiling: the drain against it is what the worker process
  costs, the real one against the bare one what the schema costs.
  ``python -m benchmarks.drain_profile`` shows where the rest goes (see docs/drain-profile.md).
* ``CPU per job`` (``benchmarks/cpu.py``, when the server runs on this machine): user + system
  time from ``/proc`` of the worker process and of every process of the server, over one more
  drain at batch 200 whose queue stays paused until the worker is ready (boot excluded), and of
  the server over the ceiling's fastest pgbench run (pgbench's client not counted). A drain needs
  the worker's CPU and the server's for each job on the same cores, the ceiling only the
  server's: the last CPU row is the fastest drain the cores allow at the drain's CPU per job
  (every core busy, nothing waiting) as a share of the ceiling, the most ``drain / ceiling``
  can be on this machine.
* ``pickup latency``: jobs sent at ~100 jobs/s from this process to a running worker; time from
  just before ``send`` to the first line of the handler (same machine, same clock). pgqueuer's,
  in the same run: ``pgqueuer.run`` with its defaults in one process, its producer in another,
  the handler's first line reporting the same difference.
* ``idle``: an idle worker with 7 queues (the 6 chassis queues and one tool queue) over 30 s:
  transactions committed in its database (``pg_stat_database.xact_commit``, read from another
  database so the measurement adds none; the database is vacuumed first and the worker given
  30 s to settle, so neither autovacuum nor boot traffic lands in the window) and WAL bytes
  (``pg_current_wal_lsn()`` difference).
  WAL is cluster-wide: the figure is only the worker's when nothing else writes, so the output
  says whether other databases wrote during the window.
* ``peak RSS``: ``VmHWM`` of the worker process right after its drain.

* ``counts``: the queue counts with 5,000,000 retained jobs (200,000 of them waiting): the
  ``/metrics`` scrape of a real worker, each scrape due to count afresh and checked to show a
  job finished just before it (target under 1 s), ``chassis-worker queues --json`` as a whole
  command (target under 2 s), and the drain above on that database and on an empty one, in one
  sitting. The database is filled once (about 2 minutes of the 5 this adds; see
  ``benchmarks/counts.py``).

* ``pooler``: drain, single send and pickup (poll mode at 0.5 and 2 s) and idle commits
  through PgBouncer in transaction mode, each beside its direct figure, with the ratios (see
  ``benchmarks/pooler.py``; needs Debian's ``pgbouncer``).

Helpers started by others add ``benchmarks/purge.py`` and ``benchmarks/ingest.py``; when they
exist, their ``main()`` runs after the queue figures, and so do ``benchmarks/counts.py`` and
``benchmarks/pooler.py``.
"""
