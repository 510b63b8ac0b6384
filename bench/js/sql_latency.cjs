// Latency of one small query from node, by argv[2] (JSON: uri, fetchEndpoint, mode, fetch,
// queries, and for "floor" the scheme and the certificate): "neon" posts it with the serverless
// driver's neon() (POST /sql); "floor" does the same to a server on another thread that answers
// at once (what node's fetch and the driver cost alone); "open" sends it on a node-postgres
// connection opened once; "connect" opens a node-postgres connection for it, queries and closes.
// fetch "node" is node's own fetch (the driver's default), "undici" undici's fetch from npm set
// as neonConfig.fetchFunction. Prints {"p50", "p95"} in milliseconds.
"use strict";
const fs = require("node:fs");
const { neon, neonConfig } = require("@neondatabase/serverless");
const pg = require("pg");

const config = JSON.parse(process.argv[2]);
neonConfig.fetchEndpoint = config.fetchEndpoint;
if (config.fetch === "undici") {
  // As the README says: undici's own fetch, which reuses a kept-alive connection at once.
  neonConfig.fetchFunction = require("undici").fetch;
}

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
    const { parentPort, workerData } = require("node:worker_threads");
    const answer = (req, res) => {
      req.resume();
      req.on("end", () => {
        res.writeHead(200, {
          "Content-Type": "application/json",
          "Content-Length": Buffer.byteLength(workerData.answer),
          "Access-Control-Allow-Origin": "*",
        });
        res.end(workerData.answer);
      });
    };
    const server = workerData.tls
      ? require("node:https").createServer(workerData.tls, answer)
      : require("node:http").createServer(answer);
    server.listen(0, "127.0.0.1", () => parentPort.postMessage(server.address().port));
  `;
  const tls =
    config.scheme === "https"
      ? { cert: fs.readFileSync(config.cert), key: fs.readFileSync(config.key) }
      : null;
  const worker = new Worker(code, { eval: true, workerData: { answer: ANSWER, tls } });
  worker.unref();
  const host = tls ? "localhost" : "127.0.0.1"; // a name the certificate has
  return new Promise((resolve) =>
    worker.once("message", (port) => resolve(`${config.scheme}://${host}:${port}/sql`)),
  );
}

async function main() {
  let once;
  let done = async () => {};
  if (config.mode === "neon") {
    const sql = neon(config.uri);
    once = (i) => sql`SELECT ${i}::int AS i`;
  } else if (config.mode === "floor") {
    // The client's own share: neon() against a server that answers every request at once,
    // with the answer the proxy gives this query. No server is faster.
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
