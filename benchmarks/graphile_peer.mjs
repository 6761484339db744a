// Runs INSIDE the graphile-worker peer directory (benchmarks/.peers/graphile-worker), never in
// ours: benchmarks/graphile_peer.py copies this file there (Node resolves "graphile-worker"
// from the script's own directory) and calls it with one command per figure. Only
// graphile-worker's public API is used (run, makeWorkerUtils, Logger); the one SQL statement
// of its own is the drain's "is the queue empty yet" probe.
//
//   node graphile_peer.mjs install DSN                   migrate graphile-worker's schema
//   node graphile_peer.mjs fill DSN JOBS                 migrate, add JOBS "noop" jobs (addJobs)
//   node graphile_peer.mjs drain DSN MODE JOBS           drain them; prints {"jobs","seconds"}
//   node graphile_peer.mjs batch DSN TOTAL CHUNK         addJobs of TOTAL jobs in calls of CHUNK
//   node graphile_peer.mjs single DSN SENDS              SENDS addJob awaited in sequence
//   node graphile_peer.mjs serve DSN MODE HOST:PORT      run until killed; each "pickup" job
//                                                        reports now - payload.t over UDP
//   node graphile_peer.mjs produce DSN JOBS RATE         addJob "pickup" at RATE per second
//
// MODE is "batched" (the settings graphile-worker documents for throughput: a local queue of
// 500, completions and failures batched with no delay, 24 concurrent jobs, a pool of 25) or
// "defaults" (none of them: one job at a time, a pool of 10).

import dgram from "node:dgram";
import { performance } from "node:perf_hooks";
import { Logger, makeWorkerUtils, run } from "graphile-worker";

// As benchmarks/enqueue.py and benchmarks/drain.py: the fill's chunk and the single sends'
// warm-up (statements prepared, pool connection open).
const FILL_CHUNK = 5_000;
const WARMUP = 200;
// The drain's end is seen by polling this often (ms): a bounded error of one interval.
const EMPTY_POLL_MS = 20;

const BATCHED = {
  concurrentJobs: 24,
  maxPoolSize: 25,
  localQueue: { size: 500 },
  completeJobBatchDelay: 0,
  failJobBatchDelay: 0,
};

// Silent: the benchmark prints figures, not graphile-worker's own lines.
const quiet = new Logger(() => () => {});

/** Wall-clock seconds with sub-millisecond resolution (Date.now() has 1 ms). */
function wallSeconds() {
  return (performance.timeOrigin + performance.now()) / 1000;
}

function nearestRank(values, q) {
  // As benchmarks.common.percentile.
  const ordered = [...values].sort((a, b) => a - b);
  const rank = Math.max(1, Math.min(ordered.length, Math.ceil((q * ordered.length) / 100)));
  return ordered[rank - 1];
}

function preset(mode) {
  if (mode === "batched") return { worker: { ...BATCHED } };
  if (mode === "defaults") return { worker: {} };
  throw new Error(`unknown mode ${mode}`);
}

async function utils(dsn) {
  const workerUtils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  await workerUtils.migrate();
  return workerUtils;
}

async function fill(dsn, jobs) {
  const workerUtils = await utils(dsn);
  try {
    for (let i = 0; i < jobs; i += FILL_CHUNK) {
      const specs = [];
      for (let n = i; n < Math.min(jobs, i + FILL_CHUNK); n++) {
        specs.push({ identifier: "noop", payload: { n } });
      }
      await workerUtils.addJobs(specs);
    }
  } finally {
    await workerUtils.release();
  }
}

async function drain(dsn, mode, jobs) {
  let first = null;
  let ran = 0;
  const taskList = {
    noop: async () => {
      if (first === null) first = wallSeconds();
      ran += 1;
    },
  };
  const runner = await run({
    connectionString: dsn,
    taskList,
    noHandleSignals: true,
    logger: quiet,
    preset: preset(mode),
  });
  // Completions are written asynchronously (in batches with the batched settings): the drain
  // ends when the last job's row is gone (graphile-worker deletes a job when it completes).
  const probe = await makeWorkerUtils({ connectionString: dsn, logger: quiet, maxPoolSize: 1 });
  let last = null;
  try {
    const deadline = Date.now() + 600_000;
    while (Date.now() < deadline) {
      const empty = await probe.withPgClient(async (client) => {
        const r = await client.query(
          "SELECT NOT EXISTS (SELECT 1 FROM graphile_worker._private_jobs) AS empty",
        );
        return r.rows[0].empty;
      });
      if (empty) {
        last = wallSeconds();
        break;
      }
      await new Promise((resolve) => setTimeout(resolve, EMPTY_POLL_MS));
    }
  } finally {
    await runner.stop();
    await probe.release();
  }
  if (last === null || first === null) throw new Error(`not drained: ${ran} of ${jobs} ran`);
  if (ran !== jobs) throw new Error(`ran ${ran} of ${jobs} jobs`);
  return { jobs, seconds: last - first };
}

async function batch(dsn, total, chunk) {
  const workerUtils = await utils(dsn);
  try {
    await workerUtils.addJobs(
      Array.from({ length: 10 }, (_, n) => ({ identifier: "noop", payload: { n } })),
    );
    const specs = Array.from({ length: total }, (_, n) => ({
      identifier: "noop",
      payload: { n, kind: "bench" },
    }));
    const started = performance.now();
    for (let i = 0; i < total; i += chunk) {
      const added = await workerUtils.addJobs(specs.slice(i, i + chunk));
      if (added.length !== Math.min(chunk, total - i)) throw new Error("addJobs lost jobs");
    }
    return { rate: total / ((performance.now() - started) / 1000) };
  } finally {
    await workerUtils.release();
  }
}

async function single(dsn, sends) {
  const workerUtils = await utils(dsn);
  try {
    for (let n = 0; n < WARMUP; n++) await workerUtils.addJob("noop", { n });
    const samples = [];
    for (let n = 0; n < sends; n++) {
      const started = performance.now();
      await workerUtils.addJob("noop", { n });
      samples.push(performance.now() - started);
    }
    return { p50: nearestRank(samples, 50), p99: nearestRank(samples, 99) };
  } finally {
    await workerUtils.release();
  }
}

async function serve(dsn, mode, addr) {
  const colon = addr.lastIndexOf(":");
  const [host, port] = [addr.slice(0, colon), Number(addr.slice(colon + 1))];
  const socket = dgram.createSocket("udp4");
  const taskList = {
    pickup: async (payload) => {
      const now = wallSeconds();
      socket.send(String(now - payload.t), port, host);
    },
  };
  const runner = await run({
    connectionString: dsn,
    taskList,
    noHandleSignals: true,
    logger: quiet,
    preset: preset(mode),
  });
  const stop = () => {
    runner.stop().finally(() => process.exit(0));
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
  await runner.promise;
}

async function produce(dsn, jobs, rate) {
  const workerUtils = await makeWorkerUtils({ connectionString: dsn, logger: quiet });
  try {
    const start = performance.now();
    for (let i = 0; i < jobs; i++) {
      const delay = start + (i * 1000) / rate - performance.now();
      if (delay > 0) await new Promise((resolve) => setTimeout(resolve, delay));
      await workerUtils.addJob("pickup", { t: wallSeconds() });
    }
  } finally {
    await workerUtils.release();
  }
}

async function main(argv) {
  const [command, dsn, ...rest] = argv;
  let out = null;
  if (command === "install") await (await utils(dsn)).release();
  else if (command === "fill") await fill(dsn, Number(rest[0]));
  else if (command === "drain") out = await drain(dsn, rest[0], Number(rest[1]));
  else if (command === "batch") out = await batch(dsn, Number(rest[0]), Number(rest[1]));
  else if (command === "single") out = await single(dsn, Number(rest[0]));
  else if (command === "serve") await serve(dsn, rest[0], rest[1]);
  else if (command === "produce") await produce(dsn, Number(rest[0]), Number(rest[1]));
  else throw new Error(`unknown command ${command}`);
  if (out !== null) console.log(JSON.stringify(out));
}

main(process.argv.slice(2)).then(
  () => process.exit(0),
  (err) => {
    console.error(err);
    process.exit(1);
  },
);
