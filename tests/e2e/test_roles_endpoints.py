"""Computes, roles and databases changed through the API and checked through Postgres itself."""

from __future__ import annotations

import re

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.support import Api, running_server

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores


def _finish(api: Api, project_id: str, body: dict) -> dict:
    ops = api.wait_operations(project_id, [o["id"] for o in body["operations"]])
    assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
    return body


def _uri(base: str, **changes: str) -> str:
    params = conninfo_to_dict(base)
    params.update(changes)
    return make_conninfo(**params)  # type: ignore[arg-type]


def test_roles_and_databases_are_real(api: Api) -> None:
    project = api.create_ready_project(name="roles")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    base = project["connection_uris"][0]["connection_uri"]
    branch = f"/projects/{pid}/branches/{bid}"

    r = api.http.post(f"{branch}/roles", json={"role": {"name": 'we"ird role'}})
    assert r.status_code == 201, r.text
    created = _finish(api, pid, r.json())
    password = created["role"]["password"]
    assert [o["action"] for o in created["operations"]] == ["apply_config"]
    weird = _uri(base, user='we"ird role', password=password)
    with psycopg.connect(weird) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ('we"ird role',)

    for method in ("GET", "POST"):
        r = api.http.request(method, f"{branch}/roles/we%22ird%20role/reveal_password")
        assert r.status_code == 200 and r.json() == {"password": password}, r.text
    listed = api.http.get(f"{branch}/roles").json()["roles"]
    assert {x["name"] for x in listed} == {"neondb_owner", 'we"ird role'}
    assert all("password" not in x for x in listed)

    r = api.http.post(f"{branch}/roles/we%22ird%20role/reset_password")
    assert r.status_code == 200, r.text
    new_password = _finish(api, pid, r.json())["role"]["password"]
    assert new_password != password
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(weird, connect_timeout=5).close()
    with psycopg.connect(_uri(base, user='we"ird role', password=new_password)):
        pass


def test_databases_are_real(api: Api) -> None:
    project = api.create_ready_project(name="databases")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    base = project["connection_uris"][0]["connection_uri"]
    branch = f"/projects/{pid}/branches/{bid}"
    r = api.http.post(f"{branch}/roles", json={"role": {"name": 'we"ird role'}})
    new_password = _finish(api, pid, r.json())["role"]["password"]

    r = api.http.post(
        f"{branch}/databases", json={"database": {"name": "app db", "owner_name": 'we"ird role'}}
    )
    assert r.status_code == 201, r.text
    _finish(api, pid, r.json())
    app = _uri(base, user='we"ird role', password=new_password, dbname="app db")
    with psycopg.connect(app, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (v int)")
        conn.execute("INSERT INTO kept VALUES (7)")

    r = api.http.patch(f"{branch}/databases/app%20db", json={"database": {"name": "renamed"}})
    assert r.status_code == 200, r.text
    _finish(api, pid, r.json())
    with psycopg.connect(_uri(app, dbname="renamed")) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (7,)  # renamed, not recreated

    r = api.http.delete(f"{branch}/roles/we%22ird%20role")
    assert r.status_code == 409 and "owns" in r.json()["message"]
    r = api.http.delete(f"{branch}/databases/renamed")
    assert r.status_code == 200, r.text
    _finish(api, pid, r.json())
    r = api.http.delete(f"{branch}/roles/we%22ird%20role")
    assert r.status_code == 200, r.text
    _finish(api, pid, r.json())
    with psycopg.connect(base) as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname = %s", ('we"ird role',)
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = 'renamed'"
        ).fetchone() == (0,)
    assert api.http.get(f"{branch}/roles/we%22ird%20role").status_code == 404
    assert api.http.get(f"{branch}/databases/renamed").status_code == 404

    r = api.http.post(f"{branch}/roles", json={"role": {"name": "reader", "no_login": True}})
    assert r.status_code == 201, r.text
    # It cannot log in, so it has no password: none shown, revealed or reset (Neon's no_login).
    assert "password" not in r.json()["role"], r.text
    _finish(api, pid, r.json())
    with psycopg.connect(base) as conn:
        assert conn.execute(
            "SELECT rolcanlogin FROM pg_roles WHERE rolname = 'reader'"
        ).fetchone() == (False,)
    for refused in ("reveal_password", "reset_password"):
        method = api.http.get if refused == "reveal_password" else api.http.post
        r = method(f"{branch}/roles/reader/{refused}")
        assert r.status_code == 400 and "no_login" in r.json()["message"], r.text


def test_bad_role_and_database_requests_change_nothing(api: Api) -> None:
    project = api.create_ready_project(name="bad")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    branch = f"/projects/{pid}/branches/{bid}"
    for body in (
        {"role": {"name": "x" * 64}},
        {"role": {"name": "é" * 32}},  # 64 bytes: Postgres would truncate it
        {"role": {"name": "pg_monitor2"}},
        {"role": {"name": ""}},
        {"role": {}},
    ):
        r = api.http.post(f"{branch}/roles", json=body)
        assert r.status_code == 400, (body, r.text)
    r = api.http.post(f"{branch}/roles", json={"role": {"name": "neondb_owner"}})
    assert r.status_code == 409
    for body in (
        {"database": {"name": "postgres", "owner_name": "neondb_owner"}},
        {"database": {"name": "d" * 64, "owner_name": "neondb_owner"}},
    ):
        r = api.http.post(f"{branch}/databases", json=body)
        assert r.status_code == 400, (body, r.text)
    # An owner that names no role is missing, like an id that names nothing.
    r = api.http.post(
        f"{branch}/databases", json={"database": {"name": "d", "owner_name": "nobody"}}
    )
    assert r.status_code == 404, r.text
    r = api.http.post(
        f"{branch}/databases", json={"database": {"name": "neondb", "owner_name": "neondb_owner"}}
    )
    assert r.status_code == 409
    assert [x["name"] for x in api.http.get(f"{branch}/roles").json()["roles"]] == ["neondb_owner"]
    assert [x["name"] for x in api.http.get(f"{branch}/databases").json()["databases"]] == [
        "neondb"
    ]
    assert api.http.get(f"{branch}/roles/nobody/reveal_password").status_code == 404
    assert api.http.get(f"/projects/{pid}/branches/br-nope-nope-00000000/roles").status_code == 404


def test_compute_lifecycle_and_connection_uri(api: Api) -> None:
    project = api.create_ready_project(name="computes")
    pid = project["project"]["id"]
    endpoint = project["endpoints"][0]
    eid = endpoint["id"]
    base = project["connection_uris"][0]["connection_uri"]

    r = api.http.get(
        f"/projects/{pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner", "pooled": "False"},
    )
    assert r.status_code == 200 and r.json()["uri"] == base, r.text
    assert (
        api.http.get(
            f"/projects/{pid}/connection_uri",
            params={"database_name": "nope", "role_name": "neondb_owner"},
        ).status_code
        == 404
    )

    r = api.http.post(
        f"/projects/{pid}/endpoints",
        json={"endpoint": {"branch_id": project["branch"]["id"], "type": "read_write"}},
    )
    assert r.status_code == 409, r.text

    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200 and r.json()["endpoint"]["pending_state"] == "idle"
    _finish(api, pid, r.json())
    got = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert got["current_state"] == "idle"
    # A connection wakes it: the proxy starts the compute and the query runs.
    with psycopg.connect(base, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    got = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert got["current_state"] == "active"
    ops = api.http.get(f"/projects/{pid}/operations").json()["operations"]
    assert ops[0]["action"] == "start_compute" and ops[0]["endpoint_id"] == eid

    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/start")
    _finish(api, pid, r.json())
    assert (
        api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]["current_state"]
        == "active"
    )


def test_compute_resize_and_settings(api: Api) -> None:
    project = api.create_ready_project(name="resize")
    pid = project["project"]["id"]
    eid = project["endpoints"][0]["id"]
    base = project["connection_uris"][0]["connection_uri"]
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{eid}",
        json={
            "endpoint": {
                "autoscaling_limit_min_cu": 1,
                "autoscaling_limit_max_cu": 2,
                "settings": {"pg_settings": {"statement_timeout": "12345"}},
                "suspend_timeout_seconds": 600,
            }
        },
    )
    assert r.status_code == 200, r.text
    assert [o["action"] for o in r.json()["operations"]] == ["apply_config"]
    _finish(api, pid, r.json())
    with psycopg.connect(base) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("12345ms",)
        assert int(conn.execute("SHOW max_connections").fetchone()[0]) > 112
    got = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert got["autoscaling_limit_max_cu"] == 2 and got["suspend_timeout_seconds"] == 600

    for body in (
        {"endpoint": {"settings": {"pg_settings": {"port": "1"}}}},
        {"endpoint": {"autoscaling_limit_min_cu": 4, "autoscaling_limit_max_cu": 2}},
        {"endpoint": {"suspend_timeout_seconds": -2}},
    ):
        r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json=body)
        assert r.status_code == 400, (body, r.text)

    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/restart")
    assert [o["action"] for o in r.json()["operations"]] == ["suspend_compute", "start_compute"]
    _finish(api, pid, r.json())
    with psycopg.connect(base) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_role_change_without_compute_then_a_new_compute(api: Api) -> None:
    project = api.create_ready_project(name="no-compute")
    pid = project["project"]["id"]
    eid = project["endpoints"][0]["id"]
    base = project["connection_uris"][0]["connection_uri"]
    r = api.http.delete(f"/projects/{pid}/endpoints/{eid}")
    assert r.status_code == 200, r.text
    _finish(api, pid, r.json())
    assert api.http.get(f"/projects/{pid}/endpoints").json() == {"endpoints": []}
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(base, connect_timeout=3).close()

    # A role change on a branch with no compute runs on a temporary postmaster.
    bid = project["branch"]["id"]
    r = api.http.post(f"/projects/{pid}/branches/{bid}/roles", json={"role": {"name": "later"}})
    _finish(api, pid, r.json())
    r = api.http.post(
        f"/projects/{pid}/endpoints", json={"endpoint": {"branch_id": bid, "type": "read_write"}}
    )
    assert r.status_code == 201, r.text
    _finish(api, pid, r.json())
    uri = api.http.get(
        f"/projects/{pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "later"},
    ).json()["uri"]
    with psycopg.connect(uri) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("later",)


def test_startup_calls_of_clients(api: Api) -> None:
    auth = api.http.get("/auth").json()
    assert auth["auth_method"] == "api_key_user" and auth["account_id"]
    me = api.http.get("/users/me").json()
    assert me["id"] == auth["account_id"] and me["email"].endswith("@example.com")
    assert api.http.get("/users/me/organizations").json() == {"organizations": []}
    shared = api.http.get("/projects/shared", params={"limit": 100}).json()
    assert shared["projects"] == []
    regions = api.http.get("/regions").json()["regions"]
    assert [r["default"] for r in regions] == [True]


def _postmaster_started(uri: str) -> object:
    with psycopg.connect(uri) as conn:
        row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
        assert row is not None
        return row[0]


def test_settings_postgres_refuses_change_nothing(api: Api) -> None:
    """Every value is read by Postgres itself before it is accepted: a compute restarted with
    one it refuses would not start again."""
    project = api.create_ready_project(name="bad-settings")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    eid = project["endpoints"][0]["id"]
    base = project["connection_uris"][0]["connection_uri"]
    started = _postmaster_started(base)
    endpoint = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    ops = api.http.get(f"/projects/{pid}/operations").json()["operations"]

    refused = {
        "statement_timeout": ("banana", 'invalid value for parameter "statement_timeout"'),
        "work_mem": ("1", "outside the valid range"),
        "timezone": ("Mars/Olympus", 'invalid value for parameter "TimeZone"'),
        "enable_seqscan": ("maybe", "requires a Boolean value"),
        "autovacuum_naptime": ("0", "outside the valid range"),
        "autovacuum_no_such_thing": ("1", "unrecognized configuration parameter"),
    }
    for name, (value, reason) in refused.items():
        bodies = [
            (f"/projects/{pid}/endpoints/{eid}", "PATCH", {"endpoint": {"settings": {}}}),
            (
                f"/projects/{pid}/endpoints",
                "POST",
                {"endpoint": {"branch_id": bid, "type": "read_write", "settings": {}}},
            ),
            (f"/projects/{pid}/branches", "POST", {"endpoints": [{"type": "read_write"}]}),
            (f"/projects/{pid}", "PATCH", {"project": {"default_endpoint_settings": {}}}),
            ("/projects", "POST", {"project": {"default_endpoint_settings": {}}}),
        ]
        for path, method, body in bodies:
            target = body.get("endpoint") or (body.get("endpoints") or [None])[0]
            if target is not None:
                target["settings"] = {"pg_settings": {name: value}}
            else:
                body["project"]["default_endpoint_settings"] = {"pg_settings": {name: value}}
            r = api.http.request(method, path, json=body)
            assert r.status_code == 400, (path, name, r.text)
            assert reason in r.json()["message"], r.text

    # Nothing changed: the same endpoint, branches, projects and operations, the same postmaster.
    # last_active aside: the session that read the postmaster's start is recorded as activity
    # when the proxy next flushes it, whatever the refused requests did.
    after = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert {**after, "last_active": None} == {**endpoint, "last_active": None}
    assert len(api.http.get(f"/projects/{pid}/branches").json()["branches"]) == 1
    assert len(api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]) == 1
    assert api.http.get(f"/projects/{pid}/operations").json()["operations"] == ops
    assert _postmaster_started(base) == started

    # Values Postgres takes, in any of its spellings, are accepted as they are.
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{eid}",
        json={"endpoint": {"settings": {"pg_settings": {"TimeZone": "Europe/Paris"}}}},
    )
    _finish(api, pid, r.json())
    with psycopg.connect(base) as conn:
        assert conn.execute("SHOW timezone").fetchone() == ("Europe/Paris",)


def test_a_compute_that_cannot_start_with_its_settings_says_so() -> None:
    """A value Postgres parses but will not start with (here: no connection left beside the
    superuser's reserved ones) fails its operation with Postgres' reason; the endpoint does not
    claim to be active, and correcting the setting brings the compute and its data back."""
    with (
        running_server(PGPLANE_RETRY_BASE_SECONDS="0.1", PGPLANE_MAX_ATTEMPTS="3") as server,
        Api(server, server.create_key("acct-start-fails")[1]) as api,
    ):
        project = api.create_ready_project(name="cannot-start")
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        base = project["connection_uris"][0]["connection_uri"]
        with psycopg.connect(base) as conn:
            conn.execute("CREATE TABLE kept AS SELECT 42 AS answer")

        path = f"/projects/{pid}/endpoints/{eid}"
        r = api.http.patch(
            path, json={"endpoint": {"settings": {"pg_settings": {"max_connections": "3"}}}}
        )
        assert r.status_code == 200, r.text
        [op] = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        assert op["status"] == "failed", op
        assert op["failures_count"] == 3
        # Postgres' own words; from 17 on it quotes the setting's name.
        assert re.search(r'must be less than "?max_connections"? \(3\)', op["error"]), op
        assert api.http.get(path).json()["endpoint"]["current_state"] == "idle"
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(base, connect_timeout=5).close()

        # Corrected, the next connection wakes it (the start a failed one gave up leaves
        # nothing pending: tests/e2e/test_failed_start.py).
        r = api.http.patch(
            path, json={"endpoint": {"settings": {"pg_settings": {"max_connections": "50"}}}}
        )
        _finish(api, pid, r.json())
        with psycopg.connect(base, connect_timeout=30) as conn:
            assert conn.execute("SELECT answer FROM kept").fetchone() == (42,)
            assert conn.execute("SHOW max_connections").fetchone() == ("50",)
        assert api.http.get(path).json()["endpoint"]["current_state"] == "active"
