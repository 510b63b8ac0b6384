"""``pgplane serve`` killed in the middle of each kind of operation loses nothing.

SIGKILL gives the process no chance to clean up: the operation it was running stays ``running``
with a lease nobody renews, and whatever it had done on disk or to a postmaster stays done. The
restarted server must take the operation over, finish it, and leave the platform as if nothing
had happened: every operation ``finished``, exactly one copy of each object, one postmaster per
running compute and none for the others, every committed row in place.

Where in an operation the kill lands is chosen with failpoints (``pgplane.failpoints``): the
server is restarted with one armed, the operation is started, and the server is killed once its
log says the failpoint was reached. ``after:<action>`` is the hardest case: the work is done,
the store does not know it.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.local.archive import tree_checksums
from tests.support import Api, Server, running_server

ROWS = 5000
SUM = ROWS * (ROWS + 1) // 2
# Short leases so a retry is not long in coming; reconciliation at start-up ends the dead
# process's leases anyway.
ENV = {
    "PGPLANE_LEASE_SECONDS": "2",
    "PGPLANE_HEARTBEAT_SECONDS": "0.5",
    "PGPLANE_SCHEDULER_SECONDS": "0.2",
    "PGPLANE_RETRY_BASE_SECONDS": "0.2",
}


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigkill_during_project_creation(delay: float) -> None:
    with running_server(**ENV) as server:
        _, key = server.create_key("crash@example.com")
        with Api(server, key) as api:
            body = api.create_project(name="interrupted")
            time.sleep(delay)
            server.stop(signal.SIGKILL)
            server.start()
            pid = body["project"]["id"]
            ops = api.wait_operations(pid, [o["id"] for o in body["operations"]])
            assert [o["status"] for o in ops] == ["finished", "finished"], (
                ops,
                server.log()[-3000:],
            )
            listed = api.http.get(f"/projects/{pid}/operations").json()["operations"]
            assert len(listed) == 2  # nothing duplicated
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=10) as conn:
                assert conn.execute("select current_database()").fetchone() == ("neondb",)
            assert_consistent(server, api, pid)


# -- the harness --------------------------------------------------------------------------


class Crash:
    """One server, one project with committed rows, and the kill at a failpoint."""

    def __init__(self, server: Server, api: Api) -> None:
        self.server = server
        self.api = api
        body = api.create_ready_project(name="victim")
        self.pid: str = body["project"]["id"]
        self.branch_id: str = body["branch"]["id"]
        self.eid: str = body["endpoints"][0]["id"]
        self.uri: str = body["connection_uris"][0]["connection_uri"]
        with psycopg.connect(self.uri, connect_timeout=30) as conn:
            conn.execute("CREATE TABLE t AS SELECT g AS v FROM generate_series(1, %s) g", [ROWS])

    def arm(self, failpoint: str, **env: str) -> None:
        """Restart the server (cleanly) with ``failpoint`` armed."""
        self.server.stop()
        self.server.env.update(env, PGPLANE_FAILPOINTS=failpoint)
        self.server.start()

    def kill_at(self, failpoint: str, timeout: float = 60) -> None:
        """Wait until the server reached ``failpoint``, SIGKILL it, restart it unarmed."""
        needle = f"failpoint {failpoint} reached"
        deadline = time.monotonic() + timeout
        while needle not in self.server.log():
            assert time.monotonic() < deadline, f"{needle!r} never logged:\n{self.server.log()}"
            time.sleep(0.05)
        self.server.stop(signal.SIGKILL)
        self.server.env.pop("PGPLANE_FAILPOINTS")
        self.server.start()

    def ops(self) -> list[dict[str, Any]]:
        r = self.api.http.get(f"/projects/{self.pid}/operations", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return list(r.json()["operations"])

    def settle(self, op_ids: list[str]) -> list[dict[str, Any]]:
        ops = self.api.wait_operations(self.pid, op_ids, timeout=120)
        assert [o["status"] for o in ops] == ["finished"] * len(ops), (ops, self.log())
        return ops

    def endpoint(self) -> dict[str, Any]:
        r = self.api.http.get(f"/projects/{self.pid}/endpoints/{self.eid}")
        assert r.status_code == 200, r.text
        return dict(r.json()["endpoint"])

    def suspend(self) -> None:
        r = self.api.http.post(f"/projects/{self.pid}/endpoints/{self.eid}/suspend")
        assert r.status_code == 200, r.text
        self.settle([o["id"] for o in r.json()["operations"]])

    def rows(self, uri: str | None = None) -> tuple[int, int]:
        with psycopg.connect(uri or self.uri, connect_timeout=60) as conn:
            row = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def log(self) -> str:
        return self.server.log()[-4000:]


@pytest.fixture
def crash() -> Iterator[Crash]:
    with running_server(**ENV) as server:
        _, key = server.create_key("crash@example.com")
        with Api(server, key) as api:
            yield Crash(server, api)


def postmasters(data_dir: Path) -> Counter[Path]:
    """Postmaster processes by data directory, for the data directories under ``data_dir``."""
    found: Counter[Path] = Counter()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        # Only the postmaster keeps its command line; its children retitle themselves.
        if b"-D" not in argv or not argv[0].endswith(b"postgres"):
            continue
        pgdata = Path(argv[argv.index(b"-D") + 1].decode())
        if pgdata.is_relative_to(data_dir):
            found[pgdata] += 1
    return found


def unsettled(data_dir: Path) -> list[tuple[str, str, str]]:
    with sqlite3.connect(data_dir / "pgplane.db") as db:
        return db.execute(
            "SELECT project_id, action, status FROM operations"
            " WHERE status IN ('scheduling', 'running')"
        ).fetchall()


def assert_consistent(server: Server, api: Api, pid: str) -> None:
    """Exactly one of everything, and the postmasters the store says and no others."""
    deadline = time.monotonic() + 60
    while unsettled(server.data_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert unsettled(server.data_dir) == []
    ops = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    for op in ops["operations"]:
        assert op["status"] == "finished" or op["error"], op

    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    names = [b["name"] for b in branches]
    assert len(names) == len(set(names))
    endpoints = api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
    assert len({e["branch_id"] for e in endpoints}) == len(endpoints)  # one per branch here

    project_dir = server.data_dir / "projects" / pid
    if project_dir.exists():  # attached: one data directory per branch, nothing half-built
        on_disk = sorted(p.name for p in (project_dir / "branches").iterdir())
        assert on_disk == sorted(b["id"] for b in branches)
        for branch in branches:
            branch_dir = project_dir / "branches" / branch["id"]
            data = {p.name for p in branch_dir.iterdir() if not p.name.endswith(".log")}
            assert data == {"pgdata"}, branch_dir  # no temporary copy left behind
    running = postmasters(server.data_dir)
    assert all(n == 1 for n in running.values()), running
    expected = {
        project_dir / "branches" / e["branch_id"] / "pgdata"
        for e in endpoints
        if e["current_state"] == "active"
    }
    assert {p for p in running if p.is_relative_to(project_dir)} == expected


# -- each kind of operation ----------------------------------------------------------------


@pytest.mark.parametrize("failpoint", ["create_branch:copied", "after:create_branch"])
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
    assert crash.rows(body["connection_uris"][0]["connection_uri"]) == (ROWS, SUM)
    assert crash.rows() == (ROWS, SUM)
    assert_consistent(crash.server, crash.api, crash.pid)


def test_kill_after_a_compute_started(crash: Crash) -> None:
    crash.suspend()
    crash.arm("after:start_compute")
    r = crash.api.http.post(f"/projects/{crash.pid}/endpoints/{crash.eid}/start")
    assert r.status_code == 200, r.text
    crash.kill_at("after:start_compute")  # the postmaster runs; the store says it is starting
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.endpoint()["current_state"] == "active"
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)


def test_kill_after_a_compute_suspended(crash: Crash) -> None:
    crash.arm("after:suspend_compute")
    r = crash.api.http.post(f"/projects/{crash.pid}/endpoints/{crash.eid}/suspend")
    assert r.status_code == 200, r.text
    crash.kill_at("after:suspend_compute")  # stopped; the store says it is running
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.endpoint()["current_state"] == "idle"
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)  # woken by the connection


def test_kill_after_a_role_and_a_password_reset_were_applied(crash: Crash) -> None:
    roles = f"/projects/{crash.pid}/branches/{crash.branch_id}/roles"
    crash.arm("after:apply_config")
    r = crash.api.http.post(roles, json={"role": {"name": "app"}})
    assert r.status_code == 201, r.text
    crash.kill_at("after:apply_config")
    crash.settle([o["id"] for o in r.json()["operations"]])
    listed = crash.api.http.get(roles).json()["roles"]
    assert [x["name"] for x in listed].count("app") == 1
    with psycopg.connect(crash.uri) as conn:
        assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'app'").fetchone() == (
            1,
        )

    old = crash.uri
    crash.arm("after:apply_config")
    r = crash.api.http.post(f"{roles}/neondb_owner/reset_password")
    assert r.status_code == 200, r.text
    crash.kill_at("after:apply_config")
    crash.settle([o["id"] for o in r.json()["operations"]])
    new = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner"},
    ).json()["uri"]
    assert new != old
    assert crash.rows(new) == (ROWS, SUM)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(old, connect_timeout=10).close()
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.parametrize("failpoint", ["tenant_detach:packed", "after:tenant_detach"])
def test_kill_during_detach(crash: Crash, failpoint: str) -> None:
    crash.suspend()
    before = data_checksums(crash)
    crash.arm(failpoint, PGPLANE_DETACH_AFTER_SECONDS="1")
    crash.kill_at(failpoint)
    detach = wait_for_op(crash, "tenant_detach")
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
    assert data_checksums(crash) == before
    assert crash.rows() == (ROWS, SUM)


@pytest.mark.parametrize("failpoint", ["tenant_reattach:unpacked", "after:tenant_reattach"])
def test_kill_during_reattach(crash: Crash, failpoint: str) -> None:
    crash.suspend()
    before = data_checksums(crash)
    crash.server.stop()
    crash.server.env["PGPLANE_DETACH_AFTER_SECONDS"] = "1"
    crash.server.start()
    crash.settle([wait_for_op(crash, "tenant_detach")["id"]])

    crash.arm(failpoint, PGPLANE_DETACH_AFTER_SECONDS="0")
    r = crash.api.http.patch(
        f"/projects/{crash.pid}", json={"project": {"history_retention_seconds": 7200}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["operations"][0]["action"] == "tenant_reattach"
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert not (crash.server.data_dir / "archive" / crash.pid).exists()
    assert data_checksums(crash) == before
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)


def wait_for_op(crash: Crash, action: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [o for o in crash.ops() if o["action"] == action]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no {action} operation:\n{crash.log()}")


def data_checksums(crash: Crash) -> dict[str, str]:
    """Every file of the project's branches (its computes stopped)."""
    return dict(tree_checksums(crash.server.data_dir / "projects" / crash.pid / "branches"))
