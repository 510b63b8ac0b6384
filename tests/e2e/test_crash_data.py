"""``pgplane serve`` killed while it copies, deletes, packs or unpacks data, or while clients write.

As test_crash.py, with the operations that move data: a branch copy (online: inside the
parent's backup; copied, not yet in place; done, not recorded), a branch's and a project's
deletion (computes stopped, files not yet removed), detach and reattach; and rows written
through the proxy, acknowledged to the client, while ``serve`` (and with it the proxy) died.
"""

from __future__ import annotations

import signal
import threading
import time

import psycopg
import pytest

from tests.crash import (
    ROWS,
    SUM,
    Crash,
    assert_consistent,
    slow,
    wait_for_op,
)
from tests.stores import store_sql
from tests.support import wait_for


@pytest.mark.both_stores
@pytest.mark.parametrize(
    "failpoint",
    ["create_branch:backup_started", slow("create_branch:copied"), slow("after:create_branch")],
)
def test_kill_during_branch_creation(crash: Crash, failpoint: str) -> None:
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={"branch": {"name": "child"}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in body["operations"]])
    crash.assert_adopted(crash.pgdata())  # the parent ran through it, untouched
    assert crash.rows(body["connection_uris"][0]["connection_uri"]) == (ROWS, SUM)
    assert crash.rows() == (ROWS, SUM)
    assert_consistent(crash.server, crash.api, crash.pid)


def test_kill_while_a_branch_is_deleted(crash: Crash) -> None:
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={"branch": {"name": "doomed"}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    child = r.json()["branch"]["id"]
    crash.settle([o["id"] for o in r.json()["operations"]])
    crash.arm("delete_timeline:stopped")
    r = crash.api.http.delete(f"/projects/{crash.pid}/branches/{child}")
    assert r.status_code == 200, r.text
    crash.kill_at("delete_timeline:stopped")  # its compute stopped, its files still there
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert not crash.pgdata(child).parent.exists()
    crash.assert_adopted(crash.pgdata())
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)


def test_kill_while_a_project_is_deleted(crash: Crash) -> None:
    crash.arm("delete_tenant:stopped")
    r = crash.api.http.delete(f"/projects/{crash.pid}")
    assert r.status_code == 200, r.text
    crash.kill_at("delete_tenant:stopped")

    def ops() -> list[tuple[str, str]]:  # gone from the API; the store keeps its operations
        query = "SELECT action, status FROM operations WHERE project_id = ?"
        return store_sql(crash.server).rows(query, [crash.pid])

    wait_for("the deletion finished", lambda: ("delete_tenant", "finished") in ops())
    assert [op for op in ops() if op[1] != "finished"] == []
    assert not (crash.server.data_dir / "projects" / crash.pid).exists()
    assert crash.postmasters_now() == {}


@pytest.mark.parametrize("failpoint", ["tenant_detach:packed", slow("after:tenant_detach")])
def test_kill_during_detach(crash: Crash, failpoint: str) -> None:
    crash.suspend()
    before = crash.checksums()
    crash.arm(failpoint, PGPLANE_DETACH_AFTER_SECONDS="1")
    crash.kill_at(failpoint)
    detach = wait_for_op(crash.api, crash.pid, "tenant_detach")
    crash.settle([detach["id"]])
    assert not (crash.server.data_dir / "projects" / crash.pid).exists()
    assert (crash.server.data_dir / "archive" / crash.pid / "manifest.json").is_file()
    assert_consistent(crash.server, crash.api, crash.pid)
    # Brought back by a request that needs the data: not one byte changed on the way.
    crash.server.stop()
    crash.server.env["PGPLANE_DETACH_AFTER_SECONDS"] = "0"
    crash.server.start()
    r = crash.api.http.patch(
        f"/projects/{crash.pid}", json={"project": {"history_retention_seconds": 7200}}
    )
    assert r.status_code == 200, r.text
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.checksums() == before
    assert crash.rows() == (ROWS, SUM)


@pytest.mark.parametrize("failpoint", ["tenant_reattach:unpacked", slow("after:tenant_reattach")])
def test_kill_during_reattach(crash: Crash, failpoint: str) -> None:
    crash.suspend()
    before = crash.checksums()
    crash.server.stop()
    crash.server.env["PGPLANE_DETACH_AFTER_SECONDS"] = "1"
    crash.server.start()
    crash.settle([wait_for_op(crash.api, crash.pid, "tenant_detach")["id"]])

    crash.arm(failpoint, PGPLANE_DETACH_AFTER_SECONDS="0")
    r = crash.api.http.patch(
        f"/projects/{crash.pid}", json={"project": {"history_retention_seconds": 7200}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["operations"][0]["action"] == "tenant_reattach"
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert not (crash.server.data_dir / "archive" / crash.pid).exists()
    assert crash.checksums() == before
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)


class Writer(threading.Thread):
    """Inserts one row per transaction through the proxy, reconnecting when the proxy goes;
    ``acked`` holds the rows whose COMMIT the client saw succeed."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.uri = uri
        self.acked: list[int] = []
        self.broken = 0  # connections that broke under the writer
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.uri, connect_timeout=5, autocommit=True) as conn:
                    while not self.stopping.is_set():
                        n += 1
                        conn.execute("INSERT INTO acks VALUES (%s)", [n])
                        self.acked.append(n)  # committed: autocommit acknowledged it
            except psycopg.OperationalError:
                self.broken += 1
                time.sleep(0.05)


def test_rows_acknowledged_through_the_proxy_survive_serve_dying(crash: Crash) -> None:
    with psycopg.connect(crash.uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE acks (id int PRIMARY KEY)")
    writer = Writer(crash.uri)
    writer.start()
    try:
        wait_for("rows acknowledged", lambda: len(writer.acked) >= 200)
        before_kill = crash.postmasters_now()
        crash.server.stop(
            signal.SIGKILL
        )  # the proxy, in serve's process, dies with every connection
        acked_at_kill = len(writer.acked)
        wait_for("the writer to see its connection break", lambda: writer.broken > 0)
        crash.server.start()
        wait_for("rows acknowledged after the restart", lambda: len(writer.acked) > acked_at_kill)
    finally:
        writer.stopping.set()
        writer.join(30)
    assert crash.postmasters_now() == before_kill  # the compute ran on, adopted
    with psycopg.connect(crash.uri) as conn:
        stored = {r[0] for r in conn.execute("SELECT id FROM acks").fetchall()}
    assert set(writer.acked) <= stored
    assert crash.rows() == (ROWS, SUM)
    assert_consistent(crash.server, crash.api, crash.pid)
