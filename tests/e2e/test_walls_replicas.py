"""A read-only compute is walled as any compute, and follows its own branch alone (issue 21).

Project A's tenant holds superuser on its computes (made so by hand, as a Postgres CVE would;
see test_walls_os.py), so it runs programs as its OS user on its primary and on its replica
(``COPY … TO PROGRAM``, which a standby allows). From there it tries to make its replica follow
project B's primary: ``ALTER SYSTEM SET primary_conninfo`` on the replica and on the primary
(whose files the next replica copies), a replication connection to B's sockets, files forged
in the replica's data directory and in the branch's WAL archive. B's primary never sees a WAL
stream from A, A's replica keeps following A, and nothing forged outlives the replica's run.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgplane.compute.local.layout import Layout
from tests.e2e.test_walls_os import Project, allowed, make_superuser
from tests.support import Api, Server, running_server, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="one OS user per project needs root (as anyone else, none exists)"
)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


def _replica(api: Api, project: Project, branch_id: str) -> tuple[str, str]:
    """A new read-only compute of the branch: its id and URI."""
    r = api.http.post(
        f"/projects/{project.id}/endpoints",
        json={"endpoint": {"branch_id": branch_id, "type": "read_only"}},
    )
    eid = api.settled(project.id, r)["endpoint"]["id"]
    uri = api.http.get(
        f"/projects/{project.id}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner", "endpoint_id": eid},
    ).json()["uri"]
    return eid, str(uri)


def _on_replica(uri: str, command: str) -> tuple[int, str]:
    """Run a shell command as the tenant on its replica (COPY TO PROGRAM writes nothing of the
    database's): its exit status and output, read back from the sandbox's own /tmp."""
    script = f"({command}) >/tmp/out 2>&1; echo rc=$? >>/tmp/out; cat >/dev/null"
    copy = sql.SQL("COPY (SELECT 1) TO PROGRAM {}").format(
        sql.Literal(f"sh -c {shlex.quote(script)}")
    )
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute(copy)
        row = conn.execute("SELECT pg_catalog.pg_read_file('/tmp/out')").fetchone()
    assert row is not None
    lines = str(row[0]).strip().splitlines()
    return int(lines[-1].removeprefix("rc=")), "\n".join(lines[:-1])


def _query(uri: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        cur = conn.execute(statement.encode())
        return cur.fetchall() if cur.description else []


def test_a_tenant_cannot_point_its_replica_at_another_project(server: Server) -> None:
    _, key_a = server.create_key("walls-replica-a@example.com")
    _, key_b = server.create_key("walls-replica-b@example.com")
    with Api(server, key_a) as api, Api(server, key_b) as b_api:
        body_a = api.create_ready_project(name="follower")
        a = Project(server, body_a)
        b = Project(server, b_api.create_ready_project(name="leader"))
        b.query("CREATE TABLE b_secret AS SELECT 'b only' AS v")
        make_superuser(a)
        a.query("CREATE TABLE mine AS SELECT 1 AS n")
        a_branch = body_a["branch"]["id"]
        layout = Layout(server.data_dir.resolve())
        b_branch = b_api.http.get(f"/projects/{b.id}/branches").json()["branches"][0]["id"]
        b_wal_sockets = layout.wal_socket_dir(b.id, b_branch)
        _, b_port = b.postmaster()
        archive = layout.branch_dir(a.id, a_branch) / "wal"

        eid, uri = _replica(api, a, a_branch)
        wait_for(
            "the superuser replayed",
            lambda: (
                _query(uri, "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
                == [(True,)]
            ),
        )
        ours = _query(uri, "SHOW primary_conninfo")[0][0]
        assert str(layout.wal_socket_dir(a.id, a_branch)) in ours

        # In the replica's sandbox: B's sockets are not there; its own archive is read-only.
        for path in (b_wal_sockets, b.socket_dir):
            rc, out = _on_replica(uri, f"ls {path}")
            assert rc != 0 and "No such file" in out, out
        rc, out = _on_replica(
            uri,
            f"psql 'host={b_wal_sockets} port={b_port} user=cloud_admin replication=true'"
            " -c IDENTIFY_SYSTEM",
        )
        assert rc != 0, out
        rc, out = _on_replica(uri, f"ls {archive} && touch {archive}/000000010000000000000099")
        assert rc != 0 and "Read-only file system" in out, out

        # ALTER SYSTEM on the replica, and on the primary (copied into the next replica): the
        # command line outranks postgresql.auto.conf.
        forged = f"host={b_wal_sockets} port={b_port} user=cloud_admin"
        _query(uri, f"ALTER SYSTEM SET primary_conninfo = '{forged}'")
        _query(uri, "SELECT pg_catalog.pg_reload_conf()")
        a.query(f"ALTER SYSTEM SET primary_conninfo = '{forged}'")
        second, second_uri = _replica(api, a, a_branch)
        assert _query(uri, "SHOW primary_conninfo") == [(ours,)]
        assert _query(second_uri, "SHOW primary_conninfo") == [(ours.replace(eid, second),)]
        # A forged file in the replica's data directory is gone with its run.
        rc, out = _on_replica(uri, "touch ./forged && ls ./forged")  # its data directory
        assert rc == 0, out
        api.suspend(a.id, eid)
        replica_dir = layout.replica_pgdata(a.id, a_branch, eid).parent
        assert not replica_dir.exists()

        # The replica still follows A, and B's primary never streamed to anyone.
        a.query("INSERT INTO mine VALUES (2)")
        wait_for(
            "A's write on its replica",
            lambda: _query(second_uri, "SELECT max(n) FROM mine") == [(2,)],
        )
        assert b.query("SELECT count(*) FROM pg_catalog.pg_stat_replication") == [(0,)]
        assert b.query("SELECT v FROM b_secret") == [("b only",)]
        allowed(a, "true")  # the primary's own walls unchanged
