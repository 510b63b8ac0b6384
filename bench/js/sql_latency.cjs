// Latency of one small query from node, by argv[2] (JSON: uri, fetchEndpoint, mode, queries):
// "neon" posts it with the serverless driver's neon() (POST /sql); "open" sends it on a
// node-postgres connection opened once; "connect" opens a node-postgres connection for it,
// queries and closes. Prints {"p50", "p95"} in milliseconds.
"use strict";
const { neon, neonConfig } = require("@neondatabase/serverless");
const pg = require("pg");

const config = JSON.parse(process.argv[2]);
neonConfig.fetchEndpoint = config.fetchEndpoint;

async function timed(n, once) {
  const ms = [];
  for (let i = 0; i < n; i++) {
    const start = process.hrtime.bigint();
    await once(i);
    ms.push(Number(process.hrtime.bigint() - start) / 1e6);
  }
  return ms.sort((a, b) => a - b);
}

async function main() {
  let once;
  let done = async () => {};
  if (config.mode === "neon") {
    const sql = neon(config.uri);
    once = (i) => sql`SELECT ${i}::int AS i`;
  } else if (config.mode === "open") {
    const client = new pg.Client({ connectionString: config.uri });
    await client.connect();
    once = (i) => client.query("SELECT $1::int AS i", [i]);
    done = () => client.end();
  } else {
    once = async (i) => {
      const client = new pg.Client({ connectionString: config.uri });
      await client.connect();
      await client.query("SELECT $1::int AS i", [i]);
      await client.end();
    };
  }
  await timed(Math.min(20, config.queries), once); // warm: the compute, the pool, the JIT
  const ms = await timed(config.queries, once);
  await done();
  const at = (q) => ms[Math.min(ms.length - 1, Math.floor(q * ms.length))];
  console.log(JSON.stringify({ p50: at(0.5), p95: at(0.95) }));
}

main().catch((e) => {
  console.error(String((e && e.stack) || e));
  process.exitCode = 1;
});
