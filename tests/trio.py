"""Three nodes on one PostgreSQL store with six projects, two on each: what the multi-node
suites share (tests/e2e/test_nodes_suite*.py), and the small readings their kill cases make
(tests/nodekill_cases.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.crash import ENV as CRASH_ENV
from tests.nodes import create_on, home, running_nodes
from tests.support import Api, Server

ROWS = 2000
SUM = ROWS * (ROWS + 1) // 2


@dataclass
class Trio:
    servers: tuple[Server, Server, Server]
    apis: tuple[Api, Api, Api]
    projects: dict[str, dict[str, Any]]  # as POST /projects answered, by project id
    homes: dict[str, Server]
    killed: set[str] = field(default_factory=set)  # operations a kill interrupted
    detached: set[str] = field(default_factory=set)  # C's projects resting in its archive
    names: Iterator[int] = field(default_factory=lambda: iter(range(10**6)))

    @property
    def a(self) -> Server:
        return self.servers[0]

    @property
    def b(self) -> Server:
        return self.servers[1]

    @property
    def c(self) -> Server:
        return self.servers[2]

    def api(self, server: Server) -> Api:
        return self.apis[self.servers.index(server)]

    def on(self, server: Server) -> list[str]:
        """The projects placed on ``server``, oldest first."""
        return [pid for pid, where in self.homes.items() if where is server]

    def name(self, prefix: str) -> str:
        return f"{prefix}-{next(self.names)}"

    def uri(self, pid: str, *, branch_id: str | None = None, role: str = "neondb_owner") -> str:
        """A connection string of the project, from its own node's API: it names that node's
        proxy, which reaches its computes."""
        params = {"role_name": role, "database_name": "neondb"}
        if branch_id is not None:
            params["branch_id"] = branch_id
        r = self.api(self.homes[pid]).http.get(f"/projects/{pid}/connection_uri", params=params)
        assert r.status_code == 200, r.text
        return str(r.json()["uri"])

    def main_branch(self, pid: str) -> str:
        return str(self.projects[pid]["branch"]["id"])

    def endpoint(self, pid: str) -> str:
        return str(self.projects[pid]["endpoints"][0]["id"])

    def fresh_on_c(self, prefix: str) -> str:
        """A new project placed on C, ready, with its table of rows."""
        api = self.api(self.a)
        body = create_on(self.c, self.servers, api, self.name(prefix))
        pid = body["project"]["id"]
        ops = api.wait_operations(pid, [o["id"] for o in body["operations"]], 120)
        assert {o["status"] for o in ops} == {"finished"}, ops
        self.projects[pid], self.homes[pid] = body, self.c
        fill(self.uri(pid))
        return pid

    def wake_c(self, *, besides: str | None = None) -> None:
        """Every suspended compute of C's projects started again (those resting in the archive
        apart): a job the scheduler starts for idle projects then finds only the case's own."""
        api = self.api(self.a)
        for pid in self.on(self.c):
            if pid == besides or pid in self.detached:
                continue
            r = api.http.get(f"/projects/{pid}/endpoints")
            assert r.status_code == 200, r.text
            for e in r.json()["endpoints"]:
                if e["current_state"] == "idle":
                    api.settled(pid, api.http.post(f"/projects/{pid}/endpoints/{e['id']}/start"))


@contextlib.contextmanager
def trio_of() -> Iterator[Trio]:
    """Three nodes and six projects, two on each (asked of the three APIs in turn: the least
    loaded node takes each), each with a table of rows."""
    # Leases of 5 s: a loaded machine's starved loop must not show a live node down.
    lease = {"PGPLANE_NODE_HEARTBEAT_SECONDS": "0.5", "PGPLANE_NODE_LEASE_SECONDS": "5"}
    with running_nodes(3, **CRASH_ENV, **lease) as servers:
        _, key = servers[0].create_key("trio@example.com")
        apis = tuple(Api(s, key) for s in servers)
        try:
            bodies = [apis[i % 3].create_project(name=f"p{i}") for i in range(6)]
            for body in bodies:
                pid = body["project"]["id"]
                ops = apis[0].wait_operations(pid, [o["id"] for o in body["operations"]], 120)
                assert {o["status"] for o in ops} == {"finished"}, ops
            projects = {b["project"]["id"]: b for b in bodies}
            homes = {pid: home(servers, pid) for pid in projects}
            trio = Trio(servers, apis, projects, homes)  # type: ignore[arg-type]
            for pid in projects:
                fill(trio.uri(pid))
            yield trio
        finally:
            for api in apis:
                api.http.close()


def fill(uri: str) -> None:
    with psycopg.connect(uri, autocommit=True, connect_timeout=30) as conn:
        conn.execute("CREATE TABLE t AS SELECT g AS v FROM generate_series(1, %s) g", [ROWS])


@dataclass
class Started:
    """What a case started: the project, its operations, and what to check once C is back."""

    pid: str
    op_ids: list[str]
    check: Callable[[dict[Path, int]], None] = lambda _: None
    gone: bool = False  # the project is deleted: its directory goes too
    detached: bool = False  # the project rests in C's archive: no data directory


def rows(uri: str) -> tuple[int, int]:
    with psycopg.connect(uri, connect_timeout=60) as conn:
        row = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def start_count(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def branch_pgdata(trio: Trio, pid: str, branch_id: str) -> Path:
    return trio.c.data_dir / "projects" / pid / "branches" / branch_id / "pgdata"
