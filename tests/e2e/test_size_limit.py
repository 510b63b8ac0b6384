"""The branch size limit, enforced inside the compute as Neon enforces it (postgres/limits/).

One server with a limit a fresh cluster is under and a few megabytes of rows reach: writes that
add data then fail with Neon's error (SQLSTATE 53100) while reads, deletes and temporary tables
go on; a TRUNCATE lets writes resume; a server restarted with a larger limit gives it to the
running compute, which is not restarted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.limits.library import Unbuildable, toolchain
from tests.support import Api, Server, _installs, postmaster_pid, running_server, wait_for

LIMIT = 48  # MiB: a fresh Postgres 18 cluster with its neondb is about 31 MiB here
RAISED = 4096
MIB = 1 << 20
ROWS = "INSERT INTO t SELECT repeat('x', 1000) FROM generate_series(1, 3000)"  # ~3 MiB


def _buildable() -> None:
    """The bundled Postgres 18 has its server headers, and every machine scripts/test runs on
    has a C compiler: the library is built here, or this suite fails saying why."""
    installs = _installs()
    assert 18 in installs, "no Postgres 18"
    try:
        toolchain(installs[18])
    except Unbuildable as exc:
        pytest.fail(f"no size-limit library for 18: {exc}")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    _buildable()
    # One attempt: an operation the limit refuses fails at once rather than after its retries.
    with running_server(PGPLANE_BRANCH_SIZE_LIMIT=str(LIMIT), PGPLANE_MAX_ATTEMPTS="1") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("size-limit@example.com")
    with Api(server, key) as client:
        yield client


@pytest.fixture(scope="module")
def project(api: Api) -> dict[str, Any]:
    return api.create_ready_project(name="size-limit", pg_version=18)


def _connect(project: dict[str, Any]) -> psycopg.Connection[Any]:
    uri = project["connection_uris"][0]["connection_uri"]
    return psycopg.connect(uri, connect_timeout=30, autocommit=True)


def _size(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT sum(pg_database_size(datname))::bigint FROM pg_database").fetchone()
    assert row is not None
    return int(row[0])


def _fill(conn: psycopg.Connection[Any]) -> errors.DiskFull:
    """Insert rows until the compute refuses them; the refusal."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            conn.execute(ROWS)
        except errors.DiskFull as exc:
            return exc
        time.sleep(0.1)
    raise AssertionError(f"no refusal after 30 s of inserts (size {_size(conn)})")


def _writes(conn: psycopg.Connection[Any]) -> bool:
    try:
        conn.execute("INSERT INTO t VALUES ('one more')")
    except errors.DiskFull:
        return False
    return True


def test_projects_show_the_limit(api: Api, project: dict[str, Any], server: Server) -> None:
    shown = api.http.get(f"/projects/{project['project']['id']}").json()["project"]
    assert shown["branch_logical_size_limit"] == LIMIT
    assert shown["branch_logical_size_limit_bytes"] == LIMIT * MIB
    listed = api.http.get("/projects").json()["projects"]
    assert [p["branch_logical_size_limit"] for p in listed] == [LIMIT]
    assert [*server.data_dir.glob("extensions/pgplane_limits-18-*.so")]
    for major, install in _installs().items():
        try:
            toolchain(install)
            continue
        except Unbuildable as exc:
            reason = str(exc)
        # Said once, at start-up, with the reason.
        assert server.log().count(f"Postgres {major} computes have no branch size limit: ") == 1
        assert reason in server.log()


def test_writes_that_add_data_stop_at_the_limit(project: dict[str, Any]) -> None:
    with _connect(project) as conn:
        fresh = _size(conn)
        assert fresh < LIMIT * MIB, f"a fresh cluster is {fresh / MIB:.1f} MiB: raise LIMIT"
        conn.execute("CREATE TABLE t (x text)")
        refused = _fill(conn)
        assert refused.sqlstate == "53100"
        assert refused.diag.message_primary == (
            f"could not extend file because project size limit ({LIMIT} MB) has been exceeded"
        )
        assert refused.diag.message_hint is not None
        assert "pgplane.max_cluster_size" in refused.diag.message_hint
        assert _size(conn) >= LIMIT * MIB
        # The tenant cannot lift it: the variable is the platform's (PGC_SIGHUP).
        with pytest.raises(errors.CantChangeRuntimeParam):
            conn.execute("SET pgplane.max_cluster_size = -1")


def test_reads_deletes_and_temporary_tables_go_on(project: dict[str, Any]) -> None:
    with _connect(project) as conn:
        row = conn.execute("SELECT count(*) FROM t").fetchone()
        assert row is not None
        assert row[0] > 0
        assert conn.execute("DELETE FROM t WHERE ctid < '(10,0)'").rowcount > 0
        conn.execute("CREATE TEMP TABLE scratch AS SELECT generate_series(1, 1000) AS n")
        conn.execute("INSERT INTO scratch SELECT n FROM scratch")
        conn.execute("CREATE INDEX ON scratch (n)")
        conn.execute("VACUUM t")
        conn.execute("ANALYZE t")
        with pytest.raises(errors.DiskFull), conn.cursor().copy("COPY t FROM STDIN") as copy:
            copy.write_row(("copied",))
        with pytest.raises(errors.DiskFull):
            conn.execute("CREATE TABLE t2 AS SELECT * FROM t")
        with pytest.raises(errors.DiskFull):
            conn.execute("CREATE INDEX ON t (x)")
        with pytest.raises(errors.DiskFull):
            conn.execute("UPDATE t SET x = 'y' WHERE ctid = (SELECT min(ctid) FROM t)")


def test_the_platforms_own_writes_meet_it_too(api: Api, project: dict[str, Any]) -> None:
    project_id, branch_id = project["project"]["id"], project["branch"]["id"]
    r = api.http.post(
        f"/projects/{project_id}/branches/{branch_id}/databases",
        json={"database": {"name": "late", "owner_name": "neondb_owner"}},
    )
    assert r.status_code == 201, r.text
    ops = api.wait_operations(project_id, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["failed"], ops
    assert "project size limit" in ops[0]["error"]


def test_writes_resume_once_space_is_freed(project: dict[str, Any]) -> None:
    with _connect(project) as conn:
        conn.execute("TRUNCATE t")
        # The compute looks at its size at most once a second.
        wait_for("writes after TRUNCATE", lambda: _writes(conn), timeout=10)


def test_a_raised_limit_reaches_the_running_compute(
    api: Api, project: dict[str, Any], server: Server
) -> None:
    with _connect(project) as conn:
        _fill(conn)
    pgdata = Layout(server.data_dir.resolve()).pgdata(
        project["project"]["id"], project["branch"]["id"]
    )
    pid = postmaster_pid(server.data_dir, pgdata)
    assert pid is not None
    server.stop()
    server.env["PGPLANE_BRANCH_SIZE_LIMIT"] = str(RAISED)
    server.start()
    assert "given to 1 running computes" in server.log()
    with _connect(project) as conn:
        wait_for("writes under the raised limit", lambda: _writes(conn), timeout=10)
    assert postmaster_pid(server.data_dir, pgdata) == pid  # reloaded, not restarted
    shown = api.http.get(f"/projects/{project['project']['id']}").json()["project"]
    assert shown["branch_logical_size_limit"] == RAISED
