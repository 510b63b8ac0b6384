"""Neon's own CLI, ``neonctl`` 5.0.1 from npm, against a real ``pgplane serve``.

Every command runs the real CLI (see tests/neonctl.py) with a fresh account's key, and the
assertions are on what neonctl prints with ``--output json``: the shapes below are neonctl's,
not the API's (it unwraps, merges and drops fields). neonctl never waits for operations, so each
test polls them through the ``api`` fixture before any step that depends on them, as a script
driving neonctl against Neon would.

Part 1 covers projects and operations; part 2 the whole branch / role / database /
connection-string flow that Neon's client reference describes (the commands and the requests
they make).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import psycopg
import pytest

from tests.neonctl import Neonctl
from tests.support import Api

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores(postgresql="slow")

OPERATION_FIELDS = {"id", "project_id", "action", "status", "created_at", "updated_at"}


def settle(api: Api, project_id: str) -> list[dict[str, Any]]:
    """Wait until every operation on the project's first (newest) page has finished."""
    r = api.http.get(f"/projects/{project_id}/operations")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(project_id, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
    return ops


def create_project(neonctl: Neonctl, api: Api, name: str) -> dict[str, Any]:
    """``neonctl projects create``, then wait for the operations it does not report."""
    out: dict[str, Any] = neonctl.json("projects", "create", "--name", name)
    settle(api, out["project"]["id"])
    return out


def default_branch(api: Api, project_id: str) -> dict[str, Any]:
    """The default branch, read through the API so part 2 depends on one neonctl call at a time."""
    r = api.http.get(f"/projects/{project_id}/branches")
    assert r.status_code == 200, r.text
    (branch,) = [b for b in r.json()["branches"] if b["default"]]
    return dict(branch)


def connect(uri: str) -> psycopg.Connection[tuple[Any, ...]]:
    """Connect with neonctl's URI exactly as built, TLS and channel binding required.

    The host is ``ep-….localhost``, which needs *.localhost to resolve (systemd-resolved does;
    this machine may not): ``hostaddr`` supplies the address and leaves the name for TLS SNI,
    which is how the proxy finds the endpoint.
    """
    query = dict(parse_qsl(urlsplit(uri).query))
    assert query == {"sslmode": "require", "channel_binding": "require"}, uri
    return psycopg.connect(uri, hostaddr="127.0.0.1", connect_timeout=10)


# ---------------------------------------------------------------------------------------------
# Part 1: projects and operations
# ---------------------------------------------------------------------------------------------


def test_projects_create_prints_project_and_connection_uris(neonctl: Neonctl, api: Api) -> None:
    out = create_project(neonctl, api, "x")
    # neonctl prints {project, connection_uris} and drops the rest (roles, operations, ...).
    assert set(out) == {"project", "connection_uris"}
    project = out["project"]
    assert project["name"] == "x"
    assert set(project) >= {"id", "name", "region_id", "created_at"}
    (uri,) = [u["connection_uri"] for u in out["connection_uris"]]
    assert uri.startswith("postgresql://neondb_owner:")
    with psycopg.connect(uri, connect_timeout=10) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == (
            "neondb_owner",
            "neondb",
        )


def test_projects_get_prints_the_bare_project(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "got")["project"]["id"]
    out = neonctl.json("projects", "get", pid)
    assert out == api.http.get(f"/projects/{pid}").json()["project"]
    assert (out["id"], out["name"], out["locked"]) == (pid, "got", False)


def test_projects_get_unknown_prints_the_error_message(neonctl: Neonctl) -> None:
    done = neonctl.run("projects", "get", "no-such-project-00000000", check=False)
    assert done.returncode == 1
    assert done.stderr.startswith("ERROR: "), done.stderr
    assert "not found" in done.stderr


def test_projects_list(neonctl: Neonctl, api: Api) -> None:
    """neonctl lists owned projects, then ``GET /projects/shared?limit=100``."""
    ids = [create_project(neonctl, api, f"listed-{i}")["project"]["id"] for i in range(2)]
    out = neonctl.json("projects", "list")
    assert set(out) == {"projects", "shared_with_you"}
    assert [p["id"] for p in out["projects"]] == list(reversed(ids))
    assert out["shared_with_you"] == []
    for project in out["projects"]:
        assert set(project) >= {"id", "name", "region_id", "created_at"}


def test_operations_list_prints_the_first_page_as_an_array(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "ops")["project"]["id"]
    out = neonctl.json("operations", "list", "--project-id", pid)
    assert isinstance(out, list)
    assert out == api.http.get(f"/projects/{pid}/operations").json()["operations"]
    assert {op["action"] for op in out} == {"create_timeline", "start_compute"}
    for op in out:
        assert set(op) >= OPERATION_FIELDS
        assert (op["project_id"], op["status"]) == (pid, "finished")


def test_projects_delete(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "doomed")["project"]["id"]
    out = neonctl.json("projects", "delete", pid)
    assert (out["id"], out["name"]) == (pid, "doomed")
    assert out["deleted_at"]
    settle(api, pid)  # the deletion's own operation stops the compute
    assert api.http.get(f"/projects/{pid}").status_code == 404
    gone = neonctl.run("projects", "get", pid, check=False)
    assert gone.returncode == 1
    assert gone.stderr.startswith("ERROR: "), gone.stderr


def test_table_output_renders(neonctl: Neonctl, api: Api) -> None:
    """The default output (a table) reads only the fields it renders; it must not crash."""
    pid = create_project(neonctl, api, "tabled")["project"]["id"]
    shown = neonctl.run("projects", "get", pid).stdout
    assert pid in shown
    assert "tabled" in shown
    ops = neonctl.run("operations", "list", "--project-id", pid).stdout
    assert "start_compute" in ops


# ---------------------------------------------------------------------------------------------
# Part 2: branches, roles, databases and connection strings
# ---------------------------------------------------------------------------------------------


def test_branches_list(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "branches")["project"]["id"]
    out = neonctl.json("branches", "list", "--project-id", pid)
    assert isinstance(out, list)  # the bare array
    (main,) = out
    assert main["default"] is True
    assert main["id"] == default_branch(api, pid)["id"]
    assert set(main) >= {"id", "name", "current_state", "created_at", "default", "protected"}
    # The table reads annotations[branch.id]: without an `annotations` object it crashes.
    table = neonctl.run("branches", "list", "--project-id", pid).stdout
    assert main["id"] in table
    assert "[default]" in table


def test_branches_create_with_compute(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "branching")["project"]["id"]
    main = default_branch(api, pid)
    out = neonctl.json("branches", "create", "--project-id", pid, "--name", "dev")
    # With a compute neonctl prints three chunks, keyed by their titles.
    assert set(out) == {"branch", "endpoints", "connection_uris"}
    branch = out["branch"]
    assert (branch["name"], branch["parent_id"]) == ("dev", main["id"])
    assert branch["id"].startswith("br-")
    (endpoint,) = out["endpoints"]
    assert (endpoint["type"], endpoint["branch_id"]) == ("read_write", branch["id"])
    assert endpoint["host"]
    (uri,) = [u["connection_uri"] for u in out["connection_uris"]]
    ops = settle(api, pid)
    assert any(op.get("branch_id") == branch["id"] for op in ops), ops
    assert any(
        (op["action"], op.get("endpoint_id")) == ("start_compute", endpoint["id"]) for op in ops
    ), ops
    with psycopg.connect(uri, connect_timeout=10) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == (
            "neondb_owner",
            "neondb",
        )
    listed = neonctl.json("branches", "list", "--project-id", pid)
    assert sorted(b["name"] for b in listed) == sorted([main["name"], "dev"])


def test_branches_create_without_compute(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "computeless")["project"]["id"]
    main = default_branch(api, pid)
    out = neonctl.json("branches", "create", "--project-id", pid, "--name", "bare", "--no-compute")
    # No endpoints and no connection URIs: neonctl prints the bare branch, not {branch: ...}.
    assert (out["name"], out["parent_id"]) == ("bare", main["id"])
    assert "endpoints" not in out
    settle(api, pid)
    r = api.http.get(f"/projects/{pid}/branches/{out['id']}/endpoints")
    assert r.status_code == 200, r.text
    assert r.json()["endpoints"] == []


def test_branches_delete_by_name(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "pruning")["project"]["id"]
    main = default_branch(api, pid)
    made = neonctl.json("branches", "create", "--project-id", pid, "--name", "dev")
    settle(api, pid)
    # A name (not an id) makes neonctl resolve it through GET .../branches?limit=100 first.
    out = neonctl.json("branches", "delete", "dev", "--project-id", pid)
    assert (out["id"], out["name"]) == (made["branch"]["id"], "dev")
    settle(api, pid)
    listed = neonctl.json("branches", "list", "--project-id", pid)
    assert [b["id"] for b in listed] == [main["id"]]


def test_role_database_and_connection_string(neonctl: Neonctl, api: Api) -> None:
    created = create_project(neonctl, api, "flow")
    pid = created["project"]["id"]
    # Data written on the parent before branching must be on the child.
    with psycopg.connect(created["connection_uris"][0]["connection_uri"]) as conn:
        conn.execute("create table seed (v text)")
        conn.execute("insert into seed values ('from main')")
    bid = neonctl.json("branches", "create", "--project-id", pid, "--name", "dev")["branch"]["id"]
    settle(api, pid)

    role = neonctl.json("roles", "create", "--project-id", pid, "--name", "r", "--branch", bid)
    assert (role["name"], role["branch_id"]) == ("r", bid)
    settle(api, pid)

    db = neonctl.json(
        "databases", "create", "--project-id", pid, "--name", "d", "--owner-name", "r",
        "--branch", bid,
    )  # fmt: skip
    assert (db["name"], db["owner_name"], db["branch_id"]) == ("d", "r", bid)
    settle(api, pid)

    uri = neonctl.run(
        "connection-string", bid, "--project-id", pid, "--role-name", "r",
        "--database-name", "d",
    ).stdout.strip()  # fmt: skip
    parts = urlsplit(uri)
    assert (parts.scheme, parts.username, parts.path) == ("postgresql", "r", "/d")
    assert parts.password
    with connect(uri) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == ("r", "d")
        conn.execute("create table mine (id int)")  # r owns d, so it may create in it

    # The default database of the child carries the parent's data.
    owner = neonctl.run(
        "connection-string", bid, "--project-id", pid, "--role-name", "neondb_owner",
        "--database-name", "neondb",
    ).stdout.strip()  # fmt: skip
    with connect(owner) as conn:
        assert conn.execute("select v from seed").fetchall() == [("from main",)]
    extended = neonctl.json(
        "connection-string", bid, "--project-id", pid, "--role-name", "r", "--database-name",
        "d", "--extended",
    )  # fmt: skip
    assert (extended["role"], extended["database"]) == ("r", "d")
    assert extended["connection_string"] == uri


def test_operations_list_after_the_branch_flow(neonctl: Neonctl, api: Api) -> None:
    pid = create_project(neonctl, api, "audited")["project"]["id"]
    before = {op["id"] for op in neonctl.json("operations", "list", "--project-id", pid)}
    bid = neonctl.json("branches", "create", "--project-id", pid, "--name", "dev")["branch"]["id"]
    settle(api, pid)
    out = neonctl.json("operations", "list", "--project-id", pid)
    new = [op for op in out if op["id"] not in before]
    assert new, json.dumps(out, indent=1)
    assert all(op["branch_id"] == bid for op in new), new
    assert all((op["project_id"], op["status"]) == (pid, "finished") for op in new), new
    for op in out:
        assert set(op) >= OPERATION_FIELDS
