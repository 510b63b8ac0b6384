// One scenario of Neon's serverless driver over HTTP (neon(), POST /sql) against pgplane's proxy,
// configured by argv[2] (JSON: uri, fetchEndpoint, scenario, fetch); prints one line of JSON with what
// it saw, or {"fatal"} when something threw that the scenario did not expect.
"use strict";
const { neon, neonConfig } = require("@neondatabase/serverless");

const config = JSON.parse(process.argv[2]);
// This machine cannot resolve *.localhost (the driver's default is https://api.<host>/sql) and
// the proxy is not on 443: the driver is told where the proxy is, as its documentation says.
neonConfig.fetchEndpoint = config.fetchEndpoint;
if (config.fetch === "undici") {
  // The README's faster client: undici's own fetch from npm, as the driver's fetchFunction.
  neonConfig.fetchFunction = require("undici").fetch;
}

function failure(e) {
  return {
    name: e.constructor.name,
    code: e.code,
    message: e.message,
    constraint: e.constraint,
    position: e.position,
    severity: e.severity,
  };
}

const scenarios = {
  async neon() {
    const out = {};
    const sql = neon(config.uri);
    out.tagged = await sql`SELECT ${41}::int + 1 AS x, ${null}::text AS nothing,
                                  ${"it's"} AS quoted, ${[1, 2, 3]}::int[] AS arr,
                                  '2026-01-02T03:04:05Z'::timestamptz AS at, '{"a":1}'::jsonb AS j`;
    const full = neon(config.uri, { fullResults: true });
    const fr = await full`SELECT 1 AS one`;
    out.full = {
      command: fr.command,
      rowCount: fr.rowCount,
      rows: fr.rows,
      fields: fr.fields.map((f) => [f.name, f.dataTypeID]),
    };
    const arrays = neon(config.uri, { arrayMode: true });
    out.arrayMode = await arrays`SELECT 1 AS a, 'b' AS b`;
    await sql`CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, name text NOT NULL)`;
    await sql`TRUNCATE items`;
    out.tx = await sql.transaction(
      [
        sql`INSERT INTO items VALUES (${1}, ${"one"})`,
        sql`SHOW transaction_isolation`,
        sql`SELECT count(*)::int AS n FROM items`,
      ],
      { isolationLevel: "Serializable" },
    );
    try {
      await sql.transaction([
        sql`INSERT INTO items VALUES (2, 'two')`,
        sql`INSERT INTO items VALUES (1, 'again')`,
      ]);
    } catch (e) {
      out.txError = failure(e);
    }
    out.afterRollback = await sql`SELECT id FROM items ORDER BY id`;
    try {
      await sql`SELECT nope FROM items`;
    } catch (e) {
      out.error = failure(e);
    }
    // 1.x calls a query given as a string sql.query(); 0.10 calls sql() itself.
    const query = sql.query ? sql.query.bind(sql) : sql;
    out.query = await query("SELECT $1::text AS v", ["by query()"]);
    return out;
  },
  async drizzle() {
    const { drizzle } = require("drizzle-orm/neon-http");
    const { pgTable, integer, text } = require("drizzle-orm/pg-core");
    const { eq } = require("drizzle-orm");
    const sql = neon(config.uri);
    await sql`CREATE TABLE IF NOT EXISTS users (id integer PRIMARY KEY, name text NOT NULL)`;
    const users = pgTable("users", {
      id: integer("id").primaryKey(),
      name: text("name").notNull(),
    });
    const db = drizzle(sql);
    await db.delete(users);
    await db.insert(users).values([
      { id: 1, name: "ada" },
      { id: 2, name: "grace" },
    ]);
    return {
      selected: await db.select().from(users).where(eq(users.id, 2)),
      batch: await db.batch([
        db.update(users).set({ name: "Ada" }).where(eq(users.id, 1)).returning(),
        db.select({ n: users.name }).from(users).orderBy(users.id),
      ]),
    };
  },
};

scenarios[config.scenario]().then(
  (out) => console.log(JSON.stringify(out)),
  (e) => {
    console.log(JSON.stringify({ fatal: String((e && e.stack) || e) }));
    process.exitCode = 1;
  },
);
