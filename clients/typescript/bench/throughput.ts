// N calls of demo.echo with K in flight (a closed loop), through the
// TypeScript client, against a capstan that serves demo.echo: what
// `capstan bench --workers 0 --no-baseline` measures for the Go client, with
// the same input ({"data": 64 x's}). Prints one JSON object.
//
//   node dist/bench/throughput.js --servers nats://127.0.0.1:4222 --n 5000 --concurrency 256

import { parseArgs } from "node:util";
import { connect } from "../src/index.js";

const { values } = parseArgs({
  options: {
    servers: { type: "string", default: process.env.CAPSTAN_NATS_URL ?? "nats://127.0.0.1:4222" },
    creds: { type: "string" },
    n: { type: "string", default: "5000" },
    concurrency: { type: "string", default: "256" },
    payload: { type: "string", default: "64" },
  },
});
const n = Number(values.n);
const k = Number(values.concurrency);
const input = { data: "x".repeat(Number(values.payload)) };

const c = await connect({
  servers: values.servers,
  actor: { kind: "service", id: "capstan-bench" }, // as capstan bench calls
  ...(values.creds !== undefined ? { creds: values.creds } : {}),
});
// Warm the path (catalog probe, connection) as the Go bench's setup does.
await c.call("demo.echo", input);

const latencies: number[] = [];
let completed = 0;
let failed = 0;
let next = 0;
const cpu0 = process.cpuUsage();
const t0 = performance.now();
await Promise.all(
  Array.from({ length: Math.min(k, n) }, async () => {
    while (next++ < n) {
      const s = performance.now();
      const env = await c.call("demo.echo", input);
      latencies.push(performance.now() - s);
      if (env.status === "completed") completed++;
      else failed++;
    }
  }),
);
const elapsed = (performance.now() - t0) / 1000;
const cpu = process.cpuUsage(cpu0);
await c.close();
latencies.sort((a, b) => a - b);
const q = (p: number): number => latencies[Math.min(latencies.length - 1, Math.floor(p * latencies.length))] ?? 0;
console.log(
  JSON.stringify({
    client: "typescript",
    n,
    concurrency: k,
    payloadBytes: Number(values.payload),
    completed,
    notCompleted: failed,
    elapsedSec: elapsed,
    executionsPerSec: n / elapsed,
    p50Ms: q(0.5),
    p99Ms: q(0.99),
    clientCpuPerExecutionUs: (cpu.user + cpu.system) / n,
  }),
);
