"""Neon's MCP server (``@neondatabase/mcp-server-neon``, the registry's latest), unchanged, run
over stdio as its users run it (``start <API key>``, ``NEON_API_HOST`` at pgplane's API) and
driven by an MCP client (tests/mcp.py): its SQL tools against a real project, each waking its
suspended compute, ``create_branch``, ``reset_from_parent`` (with a name to keep the old state
under, without, and on a branch with children), and a migration tried on a branch then applied
(``prepare_database_migration``, ``complete_database_migration``). ``compare_database_schema``
cannot be run: no published release has it (0.2.3, 0.3.4, 0.3.7, 0.6.4 and 0.6.5, the registry's
every version on 2026-11-25, were looked through); only Neon's hosted server, built from the
repository's newer code, offers it.

What the server needed from this machine, and nothing else: every SQL tool asks the API for the
connection URI and calls the driver's ``neon(uri)``, which posts to ``https://api.<host>/sql`` on
443. The server has no setting for that; this machine resolves no ``*.localhost`` name and the test
server's proxy has a port of its own, so ``neonConfig.fetchEndpoint`` is set to the proxy's address
by a preload script (``node --import`` through ``NODE_OPTIONS``, tests/js/mcp-preload.mjs), and
``NODE_EXTRA_CA_CERTS`` names the platform's CA, as the README says for the driver.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import mcp
from tests.support import Api, Server

SQL_TOOLS = {"run_sql", "run_sql_transaction", "describe_table_schema", "get_database_tables"}


@pytest.fixture(scope="module")
def prefix() -> Path:
    return mcp.install()


@pytest.fixture
def client(server: Server, api: Api, prefix: Path) -> Iterator[mcp.McpClient]:
    with mcp.McpClient(
        prefix,
        api_key=api.key,
        api_host=server.base_url,
        fetch_endpoint=f"https://localhost:{server.proxy_port}/sql",  # a name the cert has
        ca_file=server.data_dir / "tls" / "ca.crt",
    ) as found:
        info = found.initialize()
        assert info["serverInfo"]["version"] == mcp.VERSION
        yield found


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _ok(result: mcp.ToolResult) -> Any:
    assert not result.is_error, result.text
    return result.json()


def _woken(api: Api, project: dict[str, Any], call: Callable[[], mcp.ToolResult]) -> Any:
    """What ``call`` answered, made with the project's compute suspended: it woke it, once."""
    pid, endpoint = project["project"]["id"], project["endpoints"][0]["id"]
    api.suspend(pid, endpoint)
    starts = _starts(api, pid)
    found = _ok(call())
    assert _starts(api, pid) == starts + 1
    assert api.endpoint(pid, endpoint)["current_state"] == "active"
    return found


def test_sql_tools_wake_a_suspended_compute(client: mcp.McpClient, api: Api) -> None:
    assert {t["name"] for t in client.tools()} >= SQL_TOOLS
    project = api.create_ready_project(name="mcp-sql")
    pid = project["project"]["id"]

    create = "CREATE TABLE users (id serial PRIMARY KEY, email text NOT NULL UNIQUE)"
    _woken(api, project, lambda: client.call("run_sql", projectId=pid, sql=create))

    assert _woken(
        api,
        project,
        lambda: client.call(
            "run_sql_transaction",
            projectId=pid,
            sqlStatements=[
                "INSERT INTO users (email) VALUES ('ada@example.com')",
                "INSERT INTO users (email) VALUES ('grace@example.com')",
                "SELECT count(*)::int AS n FROM users",
            ],
        ),
    ) == [[], [], [{"n": 2}]]
    rows = _ok(client.call("run_sql", projectId=pid, sql="SELECT id, email FROM users ORDER BY id"))
    assert rows == [{"id": 1, "email": "ada@example.com"}, {"id": 2, "email": "grace@example.com"}]

    tables = _woken(api, project, lambda: client.call("get_database_tables", projectId=pid))
    assert {"table_schema": "public", "table_name": "users", "table_type": "BASE TABLE"} in tables

    described = _woken(
        api, project, lambda: client.call("describe_table_schema", projectId=pid, tableName="users")
    )["raw"]
    assert [(c["name"], c["type"], c["nullable"]) for c in described["columns"]] == [
        ("id", "integer", False),
        ("email", "text", False),
    ]
    assert {i["name"] for i in described["indexes"]} == {"users_pkey", "users_email_key"}
    assert {"name": "users_email_key", "type": "UNIQUE", "definition": "UNIQUE (email)"} in (
        described["constraints"]
    )

    # A failing statement is the tool's error, with Postgres' message; the batch left nothing.
    failed = client.call(
        "run_sql_transaction",
        projectId=pid,
        sqlStatements=[
            "INSERT INTO users (email) VALUES ('linus@example.com')",
            "INSERT INTO users (email) VALUES ('ada@example.com')",
        ],
    )
    assert failed.is_error
    assert 'duplicate key value violates unique constraint "users_email_key"' in failed.text
    count = _ok(client.call("run_sql", projectId=pid, sql="SELECT count(*)::int AS n FROM users"))
    assert count == [{"n": 2}]


def test_reset_from_parent(client: mcp.McpClient, api: Api) -> None:
    """The tool (by the branch's name) restores the branch from its parent through the API; like
    every branch change it takes effect once the operations it started finish, which the tool
    does not wait for: the test waits for them as a client of the API would."""
    project = api.create_ready_project(name="mcp-reset")
    pid = project["project"]["id"]
    _ok(client.call("run_sql", projectId=pid, sql="CREATE TABLE t AS SELECT 1 AS v"))
    # The tool's own branch: it always asks for Neon's autoscaled VMs (k8s-neonvm), once a 400.
    before = {o["id"] for o in api.operations(pid)}
    made = client.call("create_branch", projectId=pid, branchName="preview")
    assert not made.is_error, made.text
    started = [o["id"] for o in api.operations(pid) if o["id"] not in before]
    assert {o["status"] for o in api.wait_operations(pid, started)} == {"finished"}
    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    child = next(b for b in branches if b["name"] == "preview")
    _ok(client.call("run_sql", projectId=pid, branchId=child["id"], sql="INSERT INTO t VALUES (2)"))

    before = {o["id"] for o in api.operations(pid)}
    reset = client.call(
        "reset_from_parent", projectId=pid, branchIdOrName="preview", preserveUnderName="before"
    )
    assert not reset.is_error, reset.text
    assert "Reset to parent branch: main" in reset.text
    assert "Previous state preserved as: before" in reset.text
    started = [o["id"] for o in api.operations(pid) if o["id"] not in before]
    assert started
    assert {o["status"] for o in api.wait_operations(pid, started)} == {"finished"}

    rows = _ok(client.call("run_sql", projectId=pid, branchId=child["id"], sql="SELECT v FROM t"))
    assert rows == [{"v": 1}]
    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    preserved = next(b for b in branches if b["name"] == "before")
    assert preserved["id"] != child["id"]

    # Without children and without a name to keep it under, the old state is not kept.
    again = client.call("reset_from_parent", projectId=pid, branchIdOrName=child["id"])
    assert not again.is_error, again.text
    assert "Previous state was not preserved" in again.text
    assert client.call("reset_from_parent", projectId=pid, branchIdOrName="main").is_error


def test_reset_from_parent_of_a_branch_with_children_keeps_its_old_state(
    client: mcp.McpClient, api: Api
) -> None:
    """A branch with children cannot lose its state (the API refuses a restore without a name
    to keep it under): given none, the tool makes one up, and the old state and the children
    are kept there."""
    project = api.create_ready_project(name="mcp-reset-children")
    pid = project["project"]["id"]
    _ok(client.call("run_sql", projectId=pid, sql="CREATE TABLE t AS SELECT 1 AS v"))

    def branch(name: str, parent: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"branch": {"name": name}, "endpoints": [{"type": "read_write"}]}
        if parent is not None:
            body["branch"]["parent_id"] = parent
        created = api.http.post(f"/projects/{pid}/branches", json=body)
        return api.settled(pid, created)["branch"]  # type: ignore[no-any-return]

    preview = branch("preview")
    _ok(
        client.call(
            "run_sql", projectId=pid, branchId=preview["id"], sql="INSERT INTO t VALUES (2)"
        )
    )
    feature = branch("feature", parent=preview["id"])

    before = {o["id"] for o in api.operations(pid)}
    reset = client.call("reset_from_parent", projectId=pid, branchIdOrName=preview["id"])
    assert not reset.is_error, reset.text
    assert "Previous state auto-preserved as: preview_old_" in reset.text, reset.text
    started = [o["id"] for o in api.operations(pid) if o["id"] not in before]
    assert {o["status"] for o in api.wait_operations(pid, started)} == {"finished"}

    rows = _ok(client.call("run_sql", projectId=pid, branchId=preview["id"], sql="SELECT v FROM t"))
    assert rows == [{"v": 1}]
    branches = {b["name"]: b for b in api.http.get(f"/projects/{pid}/branches").json()["branches"]}
    [kept] = [b for name, b in branches.items() if name.startswith("preview_old_")]
    assert branches["feature"]["parent_id"] == kept["id"]  # the children went with the old state
    old = _ok(client.call("run_sql", projectId=pid, branchId=feature["id"], sql="SELECT v FROM t"))
    assert sorted(r["v"] for r in old) == [1, 2]


def test_a_migration_is_tried_on_a_branch_then_applied(client: mcp.McpClient, api: Api) -> None:
    """``prepare_database_migration`` runs the SQL on a branch of its own (made with the tool's
    k8s-neonvm provisioner); ``complete_database_migration`` applies it to the parent and deletes
    that branch."""
    project = api.create_ready_project(name="mcp-migrate")
    pid = project["project"]["id"]
    migration = "CREATE TABLE orders (id int PRIMARY KEY, total numeric)"
    prepared = client.call("prepare_database_migration", projectId=pid, migrationSql=migration)
    assert not prepared.is_error, prepared.text
    found = re.search(r"<migration_id>([0-9a-f-]{36})</migration_id>", prepared.text)
    branch = re.search(r"<id>(br-[a-z0-9-]+)</id>", prepared.text)
    assert found and branch, prepared.text
    tables = "SELECT count(*)::int AS n FROM pg_tables WHERE tablename = 'orders'"
    on_branch = _ok(client.call("run_sql", projectId=pid, branchId=branch[1], sql=tables))
    assert on_branch == [{"n": 1}]
    assert _ok(client.call("run_sql", projectId=pid, sql=tables)) == [{"n": 0}]  # main: not yet

    done = client.call("complete_database_migration", migrationId=found[1])
    assert not done.is_error, done.text
    assert _ok(client.call("run_sql", projectId=pid, sql=tables)) == [{"n": 1}]
    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert [b["name"] for b in branches] == ["main"]
