"""Projects on real Postgres: create, connect, list, update, delete."""

from __future__ import annotations

import subprocess

import psycopg
import pytest

from tests.support import Api, Server, pg_binary, pg_versions, plaintext

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

CREATE_KEYS = {
    "project",
    "connection_uris",
    "roles",
    "databases",
    "operations",
    "branch",
    "endpoints",
}
LIST_ITEM_FIELDS = {
    "id", "name", "platform_id", "region_id", "provisioner", "pg_version", "locked", "cpu_used_sec",
    "branch_logical_size_limit", "proxy_host", "created_at", "updated_at",
}  # fmt: skip


def test_create_answers_at_once_with_neon_shape(api: Api) -> None:
    body = api.create_project(name="shape")
    assert set(body) == CREATE_KEYS
    project = body["project"]
    assert project["name"] == "shape"
    assert isinstance(project["pg_version"], int)
    assert project["locked"] is True  # its operations are still pending
    assert body["branch"]["default"] is True
    assert body["branch"]["current_state"] == "init"
    assert body["branch"]["pending_state"] == "ready"
    assert [r["name"] for r in body["roles"]] == ["neondb_owner"]
    assert body["roles"][0]["password"]
    assert [(d["name"], d["owner_name"]) for d in body["databases"]] == [("neondb", "neondb_owner")]
    (endpoint,) = body["endpoints"]
    assert endpoint["type"] == "read_write"
    assert (endpoint["current_state"], endpoint["pending_state"]) == ("init", "active")
    assert len(body["connection_uris"]) == 1
    api.wait_operations(project["id"], [o["id"] for o in body["operations"]])


def test_connection_uri_works_with_psql_and_a_driver(api: Api) -> None:
    body = api.create_ready_project(name="connect")
    uri = body["connection_uris"][0]["connection_uri"]
    # The platform's own psql, which has no TLS; psycopg below takes the URI as it is.
    out = subprocess.run(
        [pg_binary("psql"), plaintext(uri), "-At", "-c", "select current_user, current_database()"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "neondb_owner|neondb"
    with psycopg.connect(uri, connect_timeout=10) as conn:
        conn.execute("create table t (id int primary key, v text)")
        conn.execute("insert into t values (1, 'kept')")
        conn.commit()
        assert conn.execute("select v from t").fetchone() == ("kept",)
    # A wrong password is refused by Postgres itself (SCRAM).
    wrong = uri.replace(body["roles"][0]["password"], "npg_wrongwrong1")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=10).close()
    project = api.http.get(f"/projects/{body['project']['id']}").json()["project"]
    assert project["locked"] is False
    # The parameters apart, as PGHOST, PGPORT and PGOPTIONS take them: the host is a name
    # alone (the port was inside it), and options name the endpoint the host does not.
    params = body["connection_uris"][0]["connection_parameters"]
    assert ":" not in params["host"] and params["options"].startswith("endpoint=ep-")
    apart = {
        "host": params["host"], "port": params["port"], "user": params["role"],
        "password": params["password"], "dbname": params["database"],
        "options": params["options"], "sslmode": "require", "connect_timeout": 10,
    }  # fmt: skip
    with psycopg.connect(**apart) as conn:
        assert conn.execute("select v from t").fetchone() == ("kept",)


def test_every_major_found_serves_projects_side_by_side(api: Api) -> None:
    # The bundled wheel's 18 beside whatever the system has (15 on Debian 12): each project keeps
    # the major it was made with, and new ones get the newest.
    majors = pg_versions()
    assert max(majors) >= 18
    uris = {}
    for major in majors:
        body = api.create_ready_project(name=f"pg{major}", pg_version=major)
        assert body["project"]["pg_version"] == major
        uris[major] = body["connection_uris"][0]["connection_uri"]
    assert api.create_ready_project(name="newest")["project"]["pg_version"] == max(majors)
    for major, uri in uris.items():
        with psycopg.connect(uri, connect_timeout=30) as conn:
            assert conn.info.server_version // 10000 == major
        out = subprocess.run(
            [pg_binary("psql", major), plaintext(uri), "-At", "-c", "show server_version_num"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert int(out.stdout) // 10000 == major


def test_custom_names(api: Api) -> None:
    body = api.create_ready_project(
        name="custom", branch={"name": "trunk", "role_name": "app", "database_name": "appdb"}
    )
    assert body["branch"]["name"] == "trunk"
    assert body["roles"][0]["name"] == "app"
    assert body["databases"][0]["name"] == "appdb"
    with psycopg.connect(body["connection_uris"][0]["connection_uri"], connect_timeout=10) as conn:
        assert conn.execute("select current_user, current_database()").fetchone() == (
            "app",
            "appdb",
        )


def test_get_and_list(api: Api, other_api: Api) -> None:
    made = [api.create_project(name=f"listed-{i}") for i in range(3)]
    ids = [m["project"]["id"] for m in made]
    got = api.http.get(f"/projects/{ids[0]}")
    assert got.status_code == 200
    assert got.json()["project"]["id"] == ids[0]

    listed = api.http.get("/projects").json()
    assert [p["id"] for p in listed["projects"]] == list(reversed(ids))
    for item in listed["projects"]:
        assert set(item) >= LIST_ITEM_FIELDS
    # Page through with limit=1: every project exactly once.
    seen, cursor = [], None
    while True:
        params: dict[str, object] = {"limit": 1}
        if cursor:
            params["cursor"] = cursor
        page = api.http.get("/projects", params=params).json()
        if not page["projects"]:
            break
        seen += [p["id"] for p in page["projects"]]
        cursor = page["pagination"]["cursor"]
    assert seen == list(reversed(ids))
    # A search keeps the projects whose name (any case) or id holds it; nothing is recoverable
    # (a deleted project's data goes at once), rather than every live project.
    api.http.patch(f"/projects/{ids[1]}", json={"project": {"name": "Shop-Prod"}})
    found = api.http.get("/projects", params={"search": "shop-p"}).json()["projects"]
    assert [p["id"] for p in found] == [ids[1]]
    found = api.http.get("/projects", params={"search": ids[2][-8:]}).json()["projects"]
    assert [p["id"] for p in found] == [ids[2]]
    assert api.http.get("/projects", params={"recoverable": "true"}).json()["projects"] == []
    # Another account sees none of them, and gets the same 404 as for a missing project.
    assert other_api.http.get("/projects").json()["projects"] == []
    foreign = other_api.http.get(f"/projects/{ids[0]}")
    missing = other_api.http.get("/projects/no-such-project-00000000")
    assert foreign.status_code == missing.status_code == 404
    foreign_body, missing_body = foreign.json(), missing.json()
    foreign_body.pop("request_id"), missing_body.pop("request_id")
    assert foreign_body == missing_body
    for m in made:
        api.wait_operations(m["project"]["id"], [o["id"] for o in m["operations"]])


def test_update_name_and_history_retention(server: Server, api: Api) -> None:
    body = api.create_ready_project(name="before")
    pid = body["project"]["id"]
    renamed = api.http.patch(f"/projects/{pid}", json={"project": {"name": "after"}})
    assert renamed.status_code == 200
    assert renamed.json()["project"]["name"] == "after"
    assert renamed.json()["operations"] == []
    retained = api.http.patch(
        f"/projects/{pid}", json={"project": {"history_retention_seconds": 7200}}
    )
    assert retained.status_code == 200
    (op,) = retained.json()["operations"]
    assert op["action"] == "apply_storage_config"
    (done,) = api.wait_operations(pid, [op["id"]])
    assert done["status"] == "finished"
    assert api.http.get(f"/projects/{pid}").json()["project"]["history_retention_seconds"] == 7200
    storage = server.data_dir / "projects" / pid / "storage.json"
    assert '"history_retention_seconds": 7200' in storage.read_text().replace(":7200", ": 7200")


def test_delete_stops_computes_and_removes_data(server: Server, api: Api) -> None:
    body = api.create_ready_project(name="doomed")
    pid = body["project"]["id"]
    uri = body["connection_uris"][0]["connection_uri"]
    psycopg.connect(uri, connect_timeout=10).close()
    assert (server.data_dir / "projects" / pid).exists()

    r = api.http.delete(f"/projects/{pid}")
    assert r.status_code == 200
    assert r.json()["project"]["id"] == pid
    (op,) = r.json()["operations"]
    assert op["action"] == "delete_tenant"
    (done,) = api.wait_operations(pid, [op["id"]])
    assert done["status"] == "finished", done

    assert api.http.get(f"/projects/{pid}").status_code == 404
    assert pid not in [p["id"] for p in api.http.get("/projects").json()["projects"]]
    assert api.http.delete(f"/projects/{pid}").status_code == 404
    assert not (server.data_dir / "projects" / pid).exists()
    with pytest.raises(psycopg.OperationalError):  # its compute is gone
        psycopg.connect(uri, connect_timeout=3).close()
    # Its operations can still be polled and listed.
    actions = [
        o["action"] for o in api.http.get(f"/projects/{pid}/operations").json()["operations"]
    ]
    assert actions == ["delete_tenant", "start_compute", "create_timeline"]


def test_bad_input_changes_nothing(api: Api) -> None:
    before = api.http.get("/projects").json()["projects"]
    bad_bodies: list[object] = [
        {},
        [],
        {"project": None},
        {"project": {"name": ""}},
        {"project": {"name": "x" * 257}},
        {"project": {"name": 5}},
        {"project": {"pg_version": "seventeen"}},
        {"project": {"pg_version": 9}},
        {"project": {"history_retention_seconds": -1}},
        {"project": {"history_retention_seconds": 2592001}},
        {"project": {"region_id": "mars-1"}},
        {"project": {"branch": {"role_name": "r" * 64}}},
        {"project": {"branch": {"database_name": "ü" * 32}}},  # 64 bytes
        {"project": {"branch": {"role_name": "bad\x00name"}}},
        {"project": {"default_endpoint_settings": {"autoscaling_limit_min_cu": 0}}},
        # Names Postgres keeps would fail create_timeline later: refused now.
        {"project": {"branch": {"role_name": "public"}}},
        {"project": {"branch": {"role_name": "pg_monitor"}}},
        {"project": {"branch": {"database_name": "template1"}}},
    ]
    for bad in bad_bodies:
        r = api.http.post("/projects", json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert set(r.json()) == {"code", "message", "request_id"}
    for raw in (b"{", b"not json", b'{"project": {"name": "a"', b"\xff\xfe"):
        r = api.http.post("/projects", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, (raw, r.text)
    huge = api.http.post("/projects", content=b'{"project": {"name": "' + b"a" * (2 << 20) + b'"}}')
    assert huge.status_code == 413
    for path in ("/projects/UPPER-case", "/projects/" + "a" * 61, "/projects/..%2F..%2Fetc"):
        r = api.http.get(path)
        assert r.status_code == 404, (path, r.text)
    for params in (
        {"limit": 0},
        {"limit": -1},
        {"limit": 401},
        {"limit": 1001},
        {"limit": "x"},
        {"cursor": "no-such-project"},
        {"cursor": "garbage!"},
    ):
        r = api.http.get("/projects", params=params)
        assert r.status_code == 400 and set(r.json()) == {"code", "message", "request_id"}, params
    assert api.http.patch("/projects/no-such-1", json={"project": {"name": "x"}}).status_code == 404
    assert api.http.get("/projects").json()["projects"] == before

    # Defaults an endpoint could not be made from are refused when set, not at the next branch.
    made = api.create_project(name="defaults")
    pid = made["project"]["id"]
    before_defaults = api.http.get(f"/projects/{pid}").json()["project"][
        "default_endpoint_settings"
    ]
    for defaults in (
        {"pg_settings": {"port": "1"}},
        {"autoscaling_limit_min_cu": 4, "autoscaling_limit_max_cu": 2},
        {"autoscaling_limit_min_cu": 4},  # above the 0.25 an absent maximum means
    ):
        r = api.http.patch(
            f"/projects/{pid}", json={"project": {"default_endpoint_settings": defaults}}
        )
        assert r.status_code == 400, (defaults, r.text)
    after = api.http.get(f"/projects/{pid}").json()["project"]["default_endpoint_settings"]
    assert after == before_defaults
    api.wait_operations(pid, [o["id"] for o in made["operations"]])
