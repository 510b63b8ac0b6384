// One scenario of Neon's serverless driver against pgplane's proxy, configured by argv[2]
// (JSON: uri, wsProxy, secure, scenario); prints one line of JSON with what it saw, or exits 1
// with the error (its message and SQLSTATE).
"use strict";
const { neonConfig, Pool, Client } = require("@neondatabase/serverless");

const config = JSON.parse(process.argv[2]);
if (config.wsProxy) {
  // This machine cannot resolve *.localhost, and the proxy is not on 443: the driver is told
  // where the proxy is, as its documentation says for such a setup. Everything else is the
  // driver's default (pipelineConnect "password", no SSLRequest inside the WebSocket).
  neonConfig.wsProxy = () => config.wsProxy;
}
neonConfig.useSecureWebSocket = config.secure;
if (config.pipeline === false) neonConfig.pipelineConnect = false; // wait for the password ask

async function transaction(client, commit) {
  await client.query("CREATE TABLE IF NOT EXISTS items (id serial PRIMARY KEY, name text)");
  await client.query("BEGIN");
  await client.query("INSERT INTO items (name) VALUES ($1)", [commit ? "kept" : "dropped"]);
  const inside = await client.query("SELECT count(*)::int AS n FROM items WHERE name = $1", [
    commit ? "kept" : "dropped",
  ]);
  await client.query(commit ? "COMMIT" : "ROLLBACK");
  return inside.rows[0].n;
}

async function counts(client) {
  const r = await client.query(
    "SELECT count(*) FILTER (WHERE name = 'kept')::int AS kept," +
      " count(*) FILTER (WHERE name = 'dropped')::int AS dropped FROM items",
  );
  return r.rows[0];
}

const scenarios = {
  async pool() {
    const pool = new Pool({ connectionString: config.uri });
    try {
      const client = await pool.connect();
      try {
        const seen = [await transaction(client, true), await transaction(client, false)];
        const user = (await client.query("SELECT current_user AS u")).rows[0].u;
        return { seen, counts: await counts(client), user };
      } finally {
        client.release();
      }
    } finally {
      await pool.end();
    }
  },
  async client() {
    const client = new Client(config.uri);
    await client.connect();
    try {
      const seen = [await transaction(client, true), await transaction(client, false)];
      // A query larger than a frame before login may be (64 KiB): frames grow once logged in.
      const big = await client.query("SELECT length($1::text) AS n", ["x".repeat(3 << 20)]);
      return { seen, counts: await counts(client), big: big.rows[0].n };
    } finally {
      await client.end();
    }
  },
  async drizzle() {
    const { drizzle } = require("drizzle-orm/neon-serverless");
    const { sql } = require("drizzle-orm");
    const pool = new Pool({ connectionString: config.uri });
    try {
      const db = drizzle(pool);
      await db.execute(sql`CREATE TABLE IF NOT EXISTS drizzled (id serial PRIMARY KEY, v int)`);
      await db.transaction(async (tx) => {
        await tx.execute(sql`INSERT INTO drizzled (v) VALUES (${41})`);
      });
      try {
        await db.transaction(async (tx) => {
          await tx.execute(sql`INSERT INTO drizzled (v) VALUES (${99})`);
          tx.rollback();
        });
      } catch (e) {
        if (!/rollback/i.test(String(e && e.message))) throw e;
      }
      const r = await db.execute(sql`SELECT array_agg(v ORDER BY v) AS vs FROM drizzled`);
      return { values: r.rows[0].vs };
    } finally {
      await pool.end();
    }
  },
  async login() {
    // Only a connection: what a refused one is told.
    const client = new Client(config.uri);
    // With the pipelined login connect() may resolve before the refusal comes: a query waits
    // for it. The refusal comes as an event too, handled here so that node does not exit.
    let refused = null;
    client.on("error", (e) => {
      refused = e;
    });
    try {
      await client.connect();
      await client.query("SELECT 1");
    } catch (e) {
      throw refused || e;
    }
    await client.end();
    return { connected: true };
  },
};

scenarios[config.scenario]()
  .then((out) => {
    console.log(JSON.stringify(out));
  })
  .catch((e) => {
    console.log(JSON.stringify({ error: String(e && e.message), code: e && e.code }));
    process.exitCode = 1;
  });
