"""Schema-only branches as Neon's clients make them: ``neonctl branches create --schema-only``
(5.0.1: it sends ``init_source`` with the default branch as ``parent_id`` and one read-write
compute) and ``@neondatabase/api-client``'s ``createProjectBranch`` with
``branch: {init_source: 'schema-only'}``, as create-branch-action v6 calls it."""

from __future__ import annotations

from typing import Any

import psycopg

from tests import apiclient
from tests.neonctl import Neonctl
from tests.support import Api, Server


def _parent(api: Api) -> dict[str, Any]:
    created = api.create_ready_project(name="schema-only-clients")
    with psycopg.connect(created["connection_uris"][0]["connection_uri"], autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id serial PRIMARY KEY, note text)")
        conn.execute("INSERT INTO orders (note) SELECT 'n' FROM generate_series(1, 20)")
    return created


def _empty_orders(uri: str) -> None:
    # The host is ep-….localhost: hostaddr reaches the proxy, the name stays for SNI.
    with psycopg.connect(uri, hostaddr="127.0.0.1", connect_timeout=10) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)


def _settle(api: Api, pid: str) -> None:
    ops = api.wait_operations(pid, [o["id"] for o in api.operations(pid)], timeout=120)
    assert {o["status"] for o in ops} == {"finished"}, ops


def test_neonctl_creates_a_schema_only_branch(neonctl: Neonctl, api: Api) -> None:
    created = _parent(api)
    pid = created["project"]["id"]
    out = neonctl.json("branches", "create", "--project-id", pid, "--name", "pr-1", "--schema-only")
    branch = out["branch"]
    assert branch["init_source"] == "schema-only" and "parent_id" not in branch
    assert [e["type"] for e in out["endpoints"]] == ["read_write"]
    _settle(api, pid)
    uri = neonctl.run(
        "connection-string", "pr-1", "--project-id", pid, "--database-name", "neondb"
    ).stdout.strip()
    _empty_orders(uri)
    table = neonctl.run("branches", "get", "pr-1", "--project-id", pid).stdout
    assert "pr-1" in table


def test_the_api_client_creates_a_schema_only_branch(server: Server, api: Api) -> None:
    created = _parent(api)
    pid = created["project"]["id"]
    script = """
const { createApiClient } = require("@neondatabase/api-client");
const client = createApiClient({ apiKey: process.env.KEY, baseURL: process.env.BASE });
(async () => {
  const r = await client.createProjectBranch(process.env.PROJECT, {
    endpoints: [{ type: "read_write", suspend_timeout_seconds: 0 }],
    branch: { name: "preview/pr-7", init_source: "schema-only" },
    annotation_value: { "github-pr-number": "7" },
  });
  console.log(JSON.stringify({ status: r.status, branch: r.data.branch,
                               uris: r.data.connection_uris }));
})().catch((e) => { console.error(e.response ? e.response.data : e); process.exit(1); });
"""
    got = apiclient.run(
        apiclient.install(),
        script,
        {"KEY": api.key, "BASE": server.base_url, "PROJECT": pid},
    )
    assert got["status"] == 201 and got["branch"]["init_source"] == "schema-only"
    _settle(api, pid)
    _empty_orders(got["uris"][0]["connection_uri"])
