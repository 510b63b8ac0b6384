// Latency of one small query from node, by argv[2] (JSON: uri, fetchEndpoint, mode, queries):
// "neon" posts it with the serverless driver's neon() (POST /sql); "floor" does the same to a
// server that answers at once (what node's fetch and the driver cost alone); "open" sends it on a
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

const ANSWER = JSON.stringify({
  command: "SELECT",
  rowCount: 1,
  rows: [["1"]],
  fields: [
    {
      name: "i",
      dataTypeID: 23,
      tableID: 0,
      columnID: 0,
      dataTypeSize: 4,
      dataTypeModifier: -1,
      format: "text",
    },
  ],
  rowAsArray: true,
});

function answeringServer() {
  const { Worker } = require("node:worker_threads");
  const code = `
    const http = require("node:http");
    const { parentPort, workerData } = require("node:worker_threads");
    const server = http.createServer((req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(workerData),
          "Access-Control-Allow-Origin": "*",
        });
        res.end(workerData);
      });
    });
    server.listen(0, "127.0.0.1", () => parentPort.postMessage(server.address().port));
  `;
  const worker = new Worker(code, { eval: true, workerData: ANSWER });
  worker.unref();
  return new Promise((resolve) =>
    worker.once("message", (port) => resolve(`http://127.0.0.1:${port}/sql`)),
  );
}

async function main() {
  let once;
  let done = async () => {};
  if (config.mode === "neon") {
    const sql = neon(config.uri);
    once = (i) => sql`SELECT ${i}::int AS i`;
  } else if (config.mode === "floor") {
    // The client's own share: neon() against a server on another thread that answers every
    // request at once, with the answer the proxy gives this query. No server is faster.
    neonConfig.fetchEndpoint = await answeringServer();
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
