// node-redlock v5 measured the way benches/engine.rs measures our engine: on the same masters, sequential
// acquire+release pairs after a warm-up, one key per pair. Prints one line:
// NODE_REDLOCK acquire_p50_ms=X acquire_p99_ms=X release_p50_ms=X pairs_per_s=X
// Usage: node bench.mjs PAIRS redis://127.0.0.1:PORT ...
import Redis from "ioredis";
import Redlock from "redlock";

const [pairsArg, ...urls] = process.argv.slice(2);
const pairs = Number(pairsArg);
const clients = urls.map((url) => new Redis(url, { enableOfflineQueue: true, lazyConnect: false }));
await Promise.all(clients.map((client) => client.ping()));
// No retries and no automatic extension: one attempt per acquire, as in our benchmark.
const redlock = new Redlock(clients, { retryCount: 0, automaticExtensionThreshold: 0 });
const ttlMs = 10_000;

const percentile = (samples, q) => {
  const sorted = [...samples].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
};
const millis = (start) => Number(process.hrtime.bigint() - start) / 1e6;

for (let i = 0; i < 200; i += 1) {
  const lock = await redlock.acquire([`node-warm-${i}`], ttlMs);
  await lock.release();
}
const acquire = [];
const release = [];
const started = process.hrtime.bigint();
for (let i = 0; i < pairs; i += 1) {
  let start = process.hrtime.bigint();
  const lock = await redlock.acquire([`node-${i}`], ttlMs);
  acquire.push(millis(start));
  start = process.hrtime.bigint();
  await lock.release();
  release.push(millis(start));
}
const seconds = millis(started) / 1000;
console.log(
  `NODE_REDLOCK acquire_p50_ms=${percentile(acquire, 0.5).toFixed(3)} acquire_p99_ms=${percentile(acquire, 0.99).toFixed(3)} ` +
    `release_p50_ms=${percentile(release, 0.5).toFixed(3)} pairs_per_s=${(pairs / seconds).toFixed(0)}`,
);
await Promise.all(clients.map((client) => client.quit()));
