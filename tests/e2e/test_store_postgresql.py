"""The platform on the PostgreSQL store: a real server (`serve --store postgresql://…`) on a
database of this test process's cluster, through the API, the CLI and the proxy; and a SQLite
store copied into PostgreSQL (`pgplane store copy`), served on from there."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest

from tests.pgstore import store_cluster
from tests.support import Api, Server, run_cli, running_server, wait_for

_emails = itertools.count()


@pytest.fixture(scope="module")
def pg_server() -> Iterator[Server]:
    url = store_cluster().database()
    with running_server(store=url) as srv:
        yield srv
        _assert_settled(url)
        # Background work (activity flushes, the scheduler's looks) fails only in the log: none
        # of its statements may have failed on this backend.
        assert "Traceback" not in srv.log(), srv.log()[-4000:]


def _assert_settled(url: str) -> None:
    """Every operation the tests started finished, read from the store itself."""
    with psycopg.connect(url) as conn:
        left = wait_for(
            "operations to settle",
            lambda: (
                not conn.execute(
                    "SELECT 1 FROM operations WHERE status IN ('scheduling', 'running')"
                ).fetchall()
                or None
            ),
        )
        assert left
        failed = conn.execute(
            "SELECT project_id, action, error FROM operations WHERE status = 'failed'"
        ).fetchall()
    assert not failed, failed


@pytest.fixture
def pg_api(pg_server: Server) -> Iterator[Api]:
    _, key = pg_server.create_key(f"pg{next(_emails)}@example.com")
    with Api(pg_server, key) as client:
        yield client


def test_projects_branches_and_endpoints_run_on_the_postgresql_store(pg_api: Api) -> None:
    body = pg_api.create_ready_project(name="on-pg")
    pid = body["project"]["id"]
    uri = body["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=10) as conn:
        conn.execute("CREATE TABLE t AS SELECT 42 AS x")
        conn.commit()

    # A branch with its own compute: its data is the parent's, its operations all finish.
    r = pg_api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
    )
    created = pg_api.settled(pid, r)
    branch_id = created["branch"]["id"]
    host = created["endpoints"][0]["host"]
    r = pg_api.http.get(
        f"/projects/{pid}/connection_uri",
        params={"branch_id": branch_id, "role_name": "neondb_owner", "database_name": "neondb"},
    )
    assert r.status_code == 200, r.text
    dev_uri = r.json()["uri"]
    assert host.split(".")[0] in dev_uri
    with psycopg.connect(dev_uri, connect_timeout=10) as conn:
        assert conn.execute("SELECT x FROM t").fetchone() == (42,)

    # Names are unique per project on this store too: a 409, not a 500.
    r = pg_api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "dev"}})
    assert r.status_code == 409, r.text

    # Roles and databases the store numbers; pages of operations, newest first, exact.
    role = pg_api.http.post(
        f"/projects/{pid}/branches/{branch_id}/roles", json={"role": {"name": "app"}}
    )
    pg_api.settled(pid, role)
    db = pg_api.http.post(
        f"/projects/{pid}/branches/{branch_id}/databases",
        json={"database": {"name": "appdb", "owner_name": "app"}},
    )
    assert pg_api.settled(pid, db)["database"]["id"] > 0
    everything = [o["id"] for o in pg_api.operations(pid)]
    paged: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, str | int] = {"limit": 2}
        if cursor is not None:
            params["cursor"] = cursor
        page = pg_api.http.get(f"/projects/{pid}/operations", params=params).json()
        if not page["operations"]:
            break
        paged += [o["id"] for o in page["operations"]]
        cursor = page["pagination"]["cursor"]
    assert paged == everything
    assert len(everything) >= 4

    # Suspend and wake the compute through the proxy.
    endpoint_id = created["endpoints"][0]["id"]
    pg_api.suspend(pid, endpoint_id)
    with psycopg.connect(dev_uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)

    r = pg_api.http.delete(f"/projects/{pid}")
    assert r.status_code == 200, r.text
    pg_api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])


def test_a_revoked_key_is_refused_at_once(pg_server: Server) -> None:
    key_id, key = pg_server.create_key("revoke-pg@example.com")
    with Api(pg_server, key) as api:
        assert api.http.get("/projects").status_code == 200
        done = run_cli(
            "api-keys",
            "revoke",
            str(key_id),
            "--account",
            "revoke-pg@example.com",
            data_dir=pg_server.data_dir,
            env=pg_server.env,
        )
        assert done.returncode == 0, done.stderr
        # The very next request: the store caches nothing across transactions.
        assert api.http.get("/projects").status_code == 401


def test_a_sqlite_store_copied_into_postgresql_is_served_on() -> None:
    url = store_cluster().database()
    with running_server() as srv:
        key_id, key = srv.create_key("copied@example.com")
        with Api(srv, key) as api:
            body = api.create_ready_project(name="moved")
            pid = body["project"]["id"]
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=10) as conn:
                conn.execute("CREATE TABLE kept AS SELECT 'yes' AS v")
                conn.commit()
            before = api.operations(pid)
            project = api.http.get(f"/projects/{pid}").json()["project"]
        srv.stop()

        done = run_cli(
            "store", "copy", "--from", str(srv.data_dir / "pgplane.db"), "--to", url,
            data_dir=srv.data_dir,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert '"rows"' in done.stdout
        # Into a database that is not empty: refused, nothing written.
        again = run_cli(
            "store", "copy", "--from", str(srv.data_dir / "pgplane.db"), "--to", url,
            data_dir=srv.data_dir,
        )  # fmt: skip
        assert again.returncode == 2
        assert "already holds data" in again.stderr

        # The same data directory, served from PostgreSQL: the same key, project, operations.
        srv.env = {**srv.env, "PGPLANE_STORE": url}
        srv.start()
        with Api(srv, key) as api:
            assert api.http.get(f"/projects/{pid}").json()["project"] == project
            assert api.operations(pid) == before
            with psycopg.connect(uri, connect_timeout=30) as conn:
                assert conn.execute("SELECT v FROM kept").fetchone() == ("yes",)
            # Ids the store assigns go on after the copied ones.
            new_id, _ = srv.create_key("copied@example.com", name="second")
            assert new_id > key_id
            r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "after"}})
            api.settled(pid, r)
