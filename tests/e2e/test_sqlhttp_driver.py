"""Neon's serverless driver (latest and 0.10.x) and Drizzle's ``neon-http``, unchanged, against a
real server: ``neon()`` over HTTP to the proxy's ``POST /sql``.

The driver's default target is ``https://api.<host>/sql`` on port 443; this machine resolves no
``*.localhost`` name and the test server's proxy listens on a port of its own, so the scripts set
``neonConfig.fetchEndpoint`` to the proxy's address (plain HTTP, which the proxy's one port also
serves). Nothing else of the driver's configuration is changed; the connection string is the one
the API returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import neondriver
from tests.support import Api, Server

_SETUP = """
const neonPackage = require(ARGS.package);
const { neon, neonConfig } = neonPackage;
neonConfig.fetchEndpoint = ARGS.endpoint;
function failure(e) {
  return { name: e.constructor.name, code: e.code, message: e.message,
           constraint: e.constraint, position: e.position, severity: e.severity };
}
async function main(out) {
"""
_RUN = """
}
const out = {};
main(out).then(() => console.log(JSON.stringify(out)),
               (e) => { console.log(JSON.stringify({ fatal: String(e && e.stack || e) })); });
"""

_NEON = """
  const sql = neon(ARGS.uri);
  out.tagged = await sql`SELECT ${41}::int + 1 AS x, ${null}::text AS nothing,
                                ${"it's"} AS quoted, ${[1, 2, 3]}::int[] AS arr,
                                '2026-01-02T03:04:05Z'::timestamptz AS at, '{"a":1}'::jsonb AS j`;
  const full = neon(ARGS.uri, { fullResults: true });
  const fr = await full`SELECT 1 AS one`;
  out.full = { command: fr.command, rowCount: fr.rowCount, rows: fr.rows,
               fields: fr.fields.map((f) => [f.name, f.dataTypeID]) };
  const arrays = neon(ARGS.uri, { arrayMode: true });
  out.arrayMode = await arrays`SELECT 1 AS a, 'b' AS b`;
  await sql`CREATE TABLE IF NOT EXISTS items (id int PRIMARY KEY, name text NOT NULL)`;
  await sql`TRUNCATE items`;
  out.tx = await sql.transaction(
    [sql`INSERT INTO items VALUES (${1}, ${"one"})`, sql`SHOW transaction_isolation`,
     sql`SELECT count(*)::int AS n FROM items`],
    { isolationLevel: "Serializable" });
  try {
    await sql.transaction([sql`INSERT INTO items VALUES (2, 'two')`,
                           sql`INSERT INTO items VALUES (1, 'again')`]);
  } catch (e) { out.txError = failure(e); }
  out.afterRollback = await sql`SELECT id FROM items ORDER BY id`;
  try { await sql`SELECT nope FROM items`; } catch (e) { out.error = failure(e); }
  const query = sql.query ? sql.query.bind(sql) : sql;
  out.query = await query("SELECT $1::text AS v", ["by query()"]);
"""

_DRIZZLE = """
  const { drizzle } = require("drizzle-orm/neon-http");
  const { pgTable, integer, text } = require("drizzle-orm/pg-core");
  const { eq } = require("drizzle-orm");
  const sql = neon(ARGS.uri);
  await sql`CREATE TABLE IF NOT EXISTS users (id integer PRIMARY KEY, name text NOT NULL)`;
  const users = pgTable("users", { id: integer("id").primaryKey(), name: text("name").notNull() });
  const db = drizzle(sql);
  await db.delete(users);
  await db.insert(users).values([{ id: 1, name: "ada" }, { id: 2, name: "grace" }]);
  out.selected = await db.select().from(users).where(eq(users.id, 2));
  out.batch = await db.batch([
    db.update(users).set({ name: "Ada" }).where(eq(users.id, 1)).returning(),
    db.select({ n: users.name }).from(users).orderBy(users.id),
  ]);
"""


def _script(body: str) -> str:
    return _SETUP + body + _RUN


@pytest.fixture(scope="module")
def prefix() -> Path:
    return neondriver.install()


def _args(server: Server, project: dict[str, Any], package: str) -> dict[str, str]:
    return {
        "package": package,
        "uri": project["connection_uris"][0]["connection_uri"],
        "endpoint": f"http://127.0.0.1:{server.proxy_port}/sql",
    }


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


@pytest.mark.parametrize("package", ["@neondatabase/serverless", neondriver.OLD_ALIAS])
def test_neon_over_http(server: Server, api: Api, prefix: Path, package: str) -> None:
    project = api.create_ready_project(name="driver-http")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    # Asleep first: the first query wakes the compute.
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    out = neondriver.run(prefix, _script(_NEON), _args(server, project, package))
    assert "fatal" not in out, out["fatal"]
    assert _starts(api, pid) == starts + 1

    assert out["tagged"] == [
        {
            "x": 42,
            "nothing": None,
            "quoted": "it's",
            "arr": [1, 2, 3],
            "at": "2026-01-02T03:04:05.000Z",  # a Date, parsed by the driver from the text
            "j": {"a": 1},
        }
    ]
    assert out["full"] == {
        "command": "SELECT",
        "rowCount": 1,
        "rows": [{"one": 1}],
        "fields": [["one", 23]],
    }
    assert out["arrayMode"] == [[1, "b"]]
    assert out["tx"] == [[], [{"transaction_isolation": "serializable"}], [{"n": 1}]]
    assert out["txError"]["name"] == "NeonDbError"
    assert (out["txError"]["code"], out["txError"]["constraint"]) == ("23505", "items_pkey")
    assert out["afterRollback"] == [{"id": 1}]  # the failed transaction left nothing
    assert out["error"]["code"] == "42703" and out["error"]["position"] == "8"
    assert out["error"]["message"] == 'column "nope" does not exist'
    assert out["query"] == [{"v": "by query()"}]


def test_drizzle_neon_http(server: Server, api: Api, prefix: Path) -> None:
    project = api.create_ready_project(name="driver-drizzle")
    pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
    api.suspend(pid, eid)
    out = neondriver.run(
        prefix, _script(_DRIZZLE), _args(server, project, "@neondatabase/serverless")
    )
    assert "fatal" not in out, out["fatal"]
    assert out["selected"] == [{"id": 2, "name": "grace"}]
    assert out["batch"] == [[{"id": 1, "name": "Ada"}], [{"n": "Ada"}, {"n": "grace"}]]
