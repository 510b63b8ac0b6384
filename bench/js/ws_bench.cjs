// pgbench -S in node, through pgplane's proxy: node-postgres over TCP (plain, or "tcp-tls"), or
// Neon's serverless driver (the same pg Client on a WebSocket) over ws:// or wss://. argv[2]:
// JSON {mode, uri, wsProxy, coalesce, clients, seconds}; prints {"tps": n}.
"use strict";
const config = JSON.parse(process.argv[2]);

function client() {
  if (config.mode === "tcp" || config.mode === "tcp-tls") {
    // "tcp-tls": the URI as the API returns it (sslmode=require; the platform's CA trusted),
    // the like-for-like baseline of wss://. Plain TCP needs the URI's sslmode changed: it wins
    // over node-postgres' `ssl: false`.
    const { Client } = require("pg");
    const plain = config.uri.replace("sslmode=require", "sslmode=disable");
    return new Client({ connectionString: config.mode === "tcp-tls" ? config.uri : plain });
  }
  const { neonConfig, Client } = require("@neondatabase/serverless");
  neonConfig.wsProxy = () => config.wsProxy;
  neonConfig.useSecureWebSocket = config.mode !== "ws";
  // The driver's default holds each write for a setTimeout(0) (at least 1 ms in node) to send
  // fewer frames: a client-side delay per query, against any server. Measured both ways.
  neonConfig.coalesceWrites = config.coalesce;
  return new Client(config.uri);
}

async function main() {
  const clients = [];
  for (let i = 0; i < config.clients; i++) {
    const c = client();
    await c.connect();
    clients.push(c);
  }
  let done = 0;
  const end = Date.now() + config.seconds * 1000;
  await Promise.all(
    clients.map(async (c) => {
      while (Date.now() < end) {
        const aid = 1 + Math.floor(Math.random() * 100000);
        // Simple protocol, as pgbench -S sends it.
        await c.query("SELECT abalance FROM pgbench_accounts WHERE aid = " + aid);
        done++;
      }
    }),
  );
  await Promise.all(clients.map((c) => c.end()));
  console.log(JSON.stringify({ tps: done / config.seconds }));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
