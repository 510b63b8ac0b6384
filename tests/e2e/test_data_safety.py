"""Data safety: an active compute is never suspended, and a branch is a clean, isolated copy.

Through the proxy and the API of the shared server, as users would: an open transaction and a
long query each keep their compute up past its suspend timeout; a branch taken while a writer
commits to two tables in one transaction holds whole transactions only, and afterwards neither
side sees the other's writes.
"""

from __future__ import annotations

import hashlib
import threading
import time
from functools import partial
from typing import Any

import psycopg
from psycopg import sql

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.sessions import admin_conninfo
from tests.e2e.test_branches import _ready_branch
from tests.e2e.test_faults import _endpoint_port, _postmaster_pid
from tests.e2e.test_scale_to_zero import _endpoint, _ops
from tests.support import Api, Server, wait_for

SUSPEND_TIMEOUT = 2


def _suspends(api: Api, pid: str) -> list[dict[str, Any]]:
    return [o for o in _ops(api, pid) if o["action"] == "suspend_compute"]


def _refuse_platform_connections(server: Server, endpoint_id: str, *, refuse: bool) -> None:
    """Close (or reopen) the compute's postgres database, over the platform's own socket."""
    socket_dir = Layout(server.data_dir.resolve()).socket_dir(endpoint_id)
    conninfo = admin_conninfo(socket_dir, _endpoint_port(server, endpoint_id))
    with psycopg.connect(conninfo, dbname="template1", autocommit=True) as conn:
        allow = sql.SQL("false" if refuse else "true")
        conn.execute(sql.SQL("ALTER DATABASE postgres ALLOW_CONNECTIONS {}").format(allow))


def test_an_open_transaction_or_a_running_query_keeps_its_compute_up(
    api: Api, server: Server
) -> None:
    quick = {"suspend_timeout_seconds": SUSPEND_TIMEOUT}
    bodies = [
        api.create_project(name=name, default_endpoint_settings=quick)
        for name in ("open-txn", "long-query", "unaskable")
    ]
    for body in bodies:
        api.wait_operations(body["project"]["id"], [o["id"] for o in body["operations"]])
    projects = [(b["project"]["id"], b["branch"]["id"], b["endpoints"][0]["id"]) for b in bodies]
    txn_uri, query_uri, unaskable_uri = (b["connection_uris"][0]["connection_uri"] for b in bodies)
    with psycopg.connect(txn_uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
    postmasters = [_postmaster_pid(server, pid, branch) for pid, branch, _ in projects]
    held = 3 * SUSPEND_TIMEOUT

    slept: list[object] = []

    def long_query() -> None:
        try:
            with psycopg.connect(query_uri, connect_timeout=30) as conn:
                slept.append(conn.execute("SELECT pg_sleep(%s), 'done'", [held]).fetchone())
        except psycopg.Error as exc:
            slept.append(exc)

    query = threading.Thread(target=long_query)
    with (
        psycopg.connect(txn_uri, connect_timeout=30) as conn,
        psycopg.connect(unaskable_uri, connect_timeout=30) as other,
    ):
        conn.execute("INSERT INTO t VALUES (1)")  # the transaction stays open, and idle
        other.execute("SELECT 1")  # here too
        # A compute the platform cannot ask what runs on it, as one too loaded to answer in
        # time: its postgres database, where the platform asks, refuses connections.
        _refuse_platform_connections(server, projects[2][2], refuse=True)
        query.start()
        # Past the timeout (the clock's own condition), then the scheduler has looked at each
        # at least once since, while the query still sleeps (it lasts three timeouts).
        time.sleep(SUSPEND_TIMEOUT + 0.5)
        server.wait_for_ticks(1)
        for pid, _, eid in projects:
            assert _suspends(api, pid) == []
            assert _endpoint(api, pid, eid)["current_state"] == "active"
        now = [_postmaster_pid(server, pid, branch) for pid, branch, _ in projects]
        assert now == postmasters
        # The sessions were never cut: they go on and commit.
        conn.execute("INSERT INTO t VALUES (2)")
        conn.commit()
        other.commit()
        _refuse_platform_connections(server, projects[2][2], refuse=False)
    query.join()
    assert slept == [("", "done")]

    # Once nothing runs any more, each suspends after its timeout, once.
    for pid, _, eid in projects:
        wait_for("the idle suspend", partial(_is_idle, api, pid, eid))
        assert [o["status"] for o in _suspends(api, pid)] == ["finished"]
    with psycopg.connect(txn_uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT v FROM t ORDER BY v").fetchall() == [(1,), (2,)]


def _is_idle(api: Api, pid: str, eid: str) -> bool:
    return bool(_endpoint(api, pid, eid)["current_state"] == "idle")


# -- a branch of a parent under two-table writes --------------------------------------------

ROWS_PER_TXN = 10


def _ids(txns: range | list[int]) -> set[int]:
    return {k * ROWS_PER_TXN + i for k in txns for i in range(ROWS_PER_TXN)}


def _checksum(ids: set[int]) -> str:
    return hashlib.md5(",".join(map(str, sorted(ids))).encode(), usedforsecurity=False).hexdigest()


def _tables(uri: str) -> tuple[set[int], set[int], str]:
    """Both tables' ids, and the server's own checksum of t1."""
    with psycopg.connect(uri, connect_timeout=30) as conn:
        t1 = {r[0] for r in conn.execute("SELECT id FROM t1").fetchall()}
        t2 = {r[0] for r in conn.execute("SELECT id FROM t2").fetchall()}
        row = conn.execute(
            "SELECT md5(coalesce(string_agg(id::text, ',' ORDER BY id), '')) FROM t1"
        ).fetchone()
    assert row is not None
    return t1, t2, str(row[0])


class TwoTableWriter(threading.Thread):
    """Commits transactions that insert the same ids into t1 and t2; keeps the committed ones."""

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri
        self.committed: list[int] = []  # transactions the parent acknowledged
        self.errors: list[BaseException] = []
        self.stop = threading.Event()

    def run(self) -> None:
        try:
            with psycopg.connect(self.uri, connect_timeout=30) as conn:
                k = 1
                while not self.stop.is_set():
                    ids = sorted(_ids([k]))
                    with conn.transaction():  # the same ids into both tables, or neither
                        conn.execute("INSERT INTO t1 SELECT unnest(%s::int[])", [ids])
                        conn.execute("INSERT INTO t2 SELECT unnest(%s::int[])", [ids])
                    self.committed.append(k)
                    k += 1
        except BaseException as exc:
            self.errors.append(exc)

    def wait_for(self, more: int) -> None:
        mark = len(self.committed)
        wait_for("the writer's commits", lambda: len(self.committed) >= mark + more)


def test_a_branch_holds_whole_transactions_and_each_side_keeps_its_own(api: Api) -> None:
    project = api.create_ready_project(name="two-tables")
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t1 (id int PRIMARY KEY)")
        conn.execute("CREATE TABLE t2 (id int PRIMARY KEY)")

    writer = TwoTableWriter(uri)
    writer.start()
    try:
        writer.wait_for(50)
        branch = _ready_branch(api, pid, endpoints=[{"type": "read_write"}])
        child_uri = branch["connection_uris"][0]["connection_uri"]
        t1, t2, _ = _tables(child_uri)
        # Whole transactions only, and every one up to some point: no torn transaction.
        assert t1 == t2
        copied = len(t1) // ROWS_PER_TXN
        assert copied >= 50
        assert t1 == _ids(range(1, copied + 1))

        # The child changes both tables while the parent keeps committing.
        with psycopg.connect(child_uri, autocommit=True) as conn:
            conn.execute("DELETE FROM t1")
            conn.execute("INSERT INTO t2 SELECT -g FROM generate_series(1, 100) g")
        writer.wait_for(20)
    finally:
        writer.stop.set()
        writer.join()
    assert not writer.errors, writer.errors

    # The parent holds exactly what its writer was told was committed, nothing of the child's.
    expected = _ids(writer.committed)
    t1, t2, checksum = _tables(uri)
    assert t1 == t2 == expected
    assert checksum == _checksum(expected)
    assert len(writer.committed) > copied
    # The child holds its own writes on the branch point, nothing the parent wrote after.
    t1, t2, checksum = _tables(child_uri)
    assert t1 == set()
    assert checksum == _checksum(set())
    assert t2 == _ids(range(1, copied + 1)) | set(range(-100, 0))
