"""The crash suites' harness: a server killed at a failpoint, and what must hold after its restart.

Where in an operation the kill lands is chosen with failpoints (``pgplane.failpoints``): the
server is restarted with one armed, the operation is started, and the server is SIGKILLed once
its log says the failpoint was reached. After the restart, :meth:`Crash.settle` and
:func:`assert_consistent` check the promises of the README: every operation finished (only the
ones a test names may fail), exactly one copy of each object, the postmasters the store says and
no others, and every compute that ran through the kill still served by the same postmaster
(adopted, not restarted), with no ``start_compute`` beyond those the test asked for.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.local.cold.archive import tree_checksums
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.tenants.cgroups import Cgroups
from tests.support import Api, Server, running_server, wait_for


def slow(failpoint: str) -> Any:
    """A kill case run with ``-m slow`` only: the default run keeps one or two per handler, the
    step inside it rather than ``after:`` where both exist (CI must stay well under 15 min)."""
    return pytest.param(failpoint, marks=pytest.mark.slow)


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
        # The postmasters serving when the server was killed, by data directory.
        self.at_kill: dict[Path, int] = {}
        # Of each: the cgroup the platform recorded for it, and the CPUs its quota allowed.
        self.cgroups_at_kill: dict[Path, tuple[str | None, float | None]] = {}
        with psycopg.connect(self.uri, connect_timeout=30) as conn:
            conn.execute("CREATE TABLE t AS SELECT g AS v FROM generate_series(1, %s) g", [ROWS])

    def arm(self, failpoint: str, **env: str) -> None:
        """Restart the server (cleanly) with ``failpoint`` armed."""
        self.server.stop()
        self.server.env.update(env, PGPLANE_FAILPOINTS=failpoint)
        self.server.start()

    def kill_at(self, failpoint: str, timeout: float = 60) -> None:
        """Wait until the server reached ``failpoint``, SIGKILL it, restart it unarmed."""
        kill_at(self.server, failpoint, timeout)
        self.at_kill = self._settled_postmasters()
        records = Records(self.server.data_dir.resolve() / "postmasters")
        cgroups, _ = Cgroups.find()
        for pgdata in self.at_kill:
            record = records.get(pgdata.resolve())
            name = None if record is None else record.cgroup
            quota = None if name is None or cgroups is None else cgroups.quota_cpus(name)
            self.cgroups_at_kill[pgdata] = (name, quota)
        self.server.env.pop("PGPLANE_FAILPOINTS")
        self.server.start()

    def _settled_postmasters(self) -> dict[Path, int]:
        """The postmasters once they stop changing: killed just after a spawn, the platform
        leaves a sandbox that has not yet exec'd postgres (a moment on a busy machine), and the
        postmaster it becomes is the one the next start must adopt."""
        seen, deadline = self.postmasters_now(), time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.1)
            now = self.postmasters_now()
            if now == seen:
                break
            seen = now
        return seen

    def postmasters_now(self) -> dict[Path, int]:
        return postmaster_pids(self.server.data_dir / "projects" / self.pid)

    def ops(self) -> list[dict[str, Any]]:
        return operations(self.api, self.pid)

    def starts(self) -> int:
        return sum(o["action"] == "start_compute" for o in self.ops())

    def settle(self, op_ids: list[str]) -> list[dict[str, Any]]:
        ops = self.api.wait_operations(self.pid, op_ids, timeout=120)
        assert [o["status"] for o in ops] == ["finished"] * len(ops), (ops, self.log())
        return ops

    def endpoint(self) -> dict[str, Any]:
        return self.api.endpoint(self.pid, self.eid)

    def suspend(self) -> None:
        self.api.suspend(self.pid, self.eid)

    def rows(self, uri: str | None = None) -> tuple[int, int]:
        with psycopg.connect(uri or self.uri, connect_timeout=60) as conn:
            row = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    def assert_adopted(self, *pgdatas: Path) -> None:
        """Each of ``pgdatas`` is served by the postmaster that served it at the kill."""
        now = self.postmasters_now()
        for pgdata in pgdatas:
            assert pgdata in self.at_kill, (pgdata, self.at_kill)
            assert now.get(pgdata) == self.at_kill[pgdata], (pgdata, self.at_kill, now)

    def assert_capped_at_kill(self, pgdata: Path, cpus: float) -> None:
        """``pgdata``'s postmaster had a cgroup of its own at the kill, of ``cpus`` CPUs (it
        joins it while it starts: one killed at its spawn may not be in it yet). Cgroups need
        root."""
        if os.geteuid() != 0:
            return
        assert pgdata in self.cgroups_at_kill, (pgdata, self.at_kill)
        name, quota = self.cgroups_at_kill[pgdata]
        assert name, f"{pgdata}'s postmaster has no cgroup"
        assert quota == cpus, (name, quota)

    def pgdata(self, branch_id: str | None = None) -> Path:
        return (
            self.server.data_dir
            / "projects"
            / self.pid
            / "branches"
            / (branch_id or self.branch_id)
            / "pgdata"
        )

    def checksums(self, *branch_ids: str) -> dict[str, str]:
        """Every file of the project's branches' data, or of ``branch_ids`` only: their computes
        must be stopped (a running one writes and removes WAL files under the walk). Their history
        beside it is left out: the keeper catalogues, takes and frees it on its own time."""
        branches = self.server.data_dir / "projects" / self.pid / "branches"
        return {
            f"{branch.name}/pgdata/{path}": digest
            for branch in sorted(branches.iterdir())
            if (branch / "pgdata").is_dir() and (not branch_ids or branch.name in branch_ids)
            for path, digest in tree_checksums(branch / "pgdata").items()
        }

    def log(self) -> str:
        return self.server.log()[-4000:]


@pytest.fixture
def crash(store_backend: str) -> Iterator[Crash]:
    """A server with short leases and a project with rows (the crash suites' fixture: their
    conftest is tests/conftest.py, which imports it), on the module's store backend."""
    from tests.stores import server_store

    with running_server(store=server_store(store_backend), **ENV) as server:
        _, key = server.create_key("crash@example.com")
        with Api(server, key) as api:
            yield Crash(server, api)


def kill_at(server: Server, failpoint: str, timeout: float = 60) -> None:
    """SIGKILL ``server`` once its log says ``failpoint`` was reached."""
    needle = f"failpoint {failpoint} reached"
    wait_for(f"{needle!r} in the log", lambda: needle in server.log(), timeout, server=server)
    server.stop(signal.SIGKILL)


def operations(api: Api, project_id: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{project_id}/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["operations"])


def wait_for_op(api: Api, project_id: str, action: str, timeout: float = 60) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        return next((o for o in operations(api, project_id) if o["action"] == action), None)

    op: dict[str, Any] = wait_for(f"a {action} operation", found, timeout, server=api.server)
    return op


def postmaster_pids(data_dir: Path) -> dict[Path, int]:
    """The postmaster of each data directory under ``data_dir`` that has exactly one."""
    found: dict[Path, list[int]] = {}
    for pgdata, pid in _postmaster_processes(data_dir):
        found.setdefault(pgdata, []).append(pid)
    return {pgdata: pids[0] for pgdata, pids in found.items() if len(pids) == 1}


def postmasters(data_dir: Path) -> Counter[Path]:
    """Postmaster processes by data directory, for the data directories under ``data_dir``.
    A backend forked a moment ago still shows its postmaster's command line until it retitles
    itself: a process whose parent is a postmaster of the same data is not counted."""
    found = list(_postmaster_processes(data_dir))
    pids = {pid: pgdata for pgdata, pid in found}
    return Counter(pgdata for pgdata, pid in found if pids.get(_parent(pid)) != pgdata)


def _parent(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None  # exited meanwhile
    for line in status.splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    return None


def _postmaster_processes(data_dir: Path) -> Iterator[tuple[Path, int]]:
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
            yield pgdata, int(proc.name)


def unsettled(server: Server) -> list[tuple[str, str, str]]:
    """Operations not settled, of every project, read from the server's store."""
    from tests.stores import store_sql

    return store_sql(server).rows(
        "SELECT project_id, action, status FROM operations"
        " WHERE status IN ('scheduling', 'running')"
    )


def assert_consistent(server: Server, api: Api, pid: str, *, failed: Collection[str] = ()) -> None:
    """Exactly one of everything, and the postmasters the store says and no others.

    Every operation of the project finished, but those whose ids are in ``failed``, which
    must have failed, with a reason.
    """
    wait_for("every operation settled", lambda: not unsettled(server), server=server)
    for op in operations(api, pid):
        if op["id"] in failed:
            assert op["status"] == "failed" and op["error"], op
        else:
            assert op["status"] == "finished", (op, server.log()[-4000:])

    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    names = [b["name"] for b in branches]
    assert len(names) == len(set(names))
    endpoints = api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
    writable = [e["branch_id"] for e in endpoints if e["type"] == "read_write"]
    assert len(set(writable)) == len(writable)  # one read-write compute per branch

    project_dir = server.data_dir / "projects" / pid
    if project_dir.exists():  # attached: one data directory per branch, nothing half-built
        on_disk = sorted(p.name for p in (project_dir / "branches").iterdir())
        assert on_disk == sorted(b["id"] for b in branches)
        for branch in branches:
            branch_dir = project_dir / "branches" / branch["id"]
            # A reset's old data is removed in the background (or by the next start's sweep).
            wait_for(
                f"the old data of {branch['id']} removed",
                lambda d=branch_dir: not list(d.glob(".trash-*")),
                server=server,
            )
            # No temporary copy left behind (a rebuild's, a restore's); its history beside it.
            data = {p.name for p in branch_dir.iterdir() if not p.name.endswith(".log")}
            assert data - {"wal", "base", "restored", "replicas"} == {"pgdata"}, (branch_dir, data)
            # A replica's data only while it runs, whole (its copy renamed into place).
            replicas = branch_dir / "replicas"
            held = {p.name: sorted(c.name for c in p.iterdir()) for p in _listed(replicas)}
            assert held == {
                e["id"]: ["pgdata"]
                for e in endpoints
                if e["type"] == "read_only"
                and e["branch_id"] == branch["id"]
                and e["current_state"] == "active"
            }, held
    running = postmasters(server.data_dir)
    assert all(n == 1 for n in running.values()), running
    expected = {
        project_dir / "branches" / e["branch_id"] / "pgdata"
        if e["type"] == "read_write"
        else project_dir / "branches" / e["branch_id"] / "replicas" / e["id"] / "pgdata"
        for e in endpoints
        if e["current_state"] == "active"
    }
    assert {p for p in running if p.is_relative_to(project_dir)} == expected


def _listed(directory: Path) -> list[Path]:
    return sorted(directory.iterdir()) if directory.is_dir() else []
