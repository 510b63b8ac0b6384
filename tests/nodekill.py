"""Three nodes, and node C killed in the middle of an operation: the multi-node suites' harness
(tests/e2e/test_nodes_suite*.py).

A case starts one kind of operation on a project of C's, through another node's API, with a
failpoint armed on C; C is SIGKILLed once its log says the failpoint was reached. While C is
down, the other nodes' own projects keep working and C's projects are still read. C is started
again (same data directory, same name) and what its handler did is counted, not assumed:

- every operation of the project was attempted on C and on no other node, once each, and
  twice the one the kill interrupted (its killed attempt and the retry), never at once;
- C's /metrics, fresh since the restart, count exactly the operations it finished since;
- the project's data is on C only (one data directory per branch, none half built), each
  compute is served by exactly one postmaster, the one that ran through the kill where one did,
  with no start beyond those asked for;
- each kind's own evidence: a branch's copy put in place once ("branched …", in all three
  logs), a role once in ``pg_roles``, the project's rows once.
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from tests.crash import ENV as CRASH_ENV
from tests.crash import assert_consistent, postmaster_pids
from tests.nodes import (
    attempts_everywhere,
    create_on,
    finished_ops,
    home,
    node_of,
    running_nodes,
    wait_down,
)
from tests.stores import store_sql
from tests.support import Api, Server, wait_for

ROWS = 2000
SUM = ROWS * (ROWS + 1) // 2


@dataclass
class Trio:
    servers: tuple[Server, Server, Server]
    apis: tuple[Api, Api, Api]
    projects: dict[str, dict[str, Any]]  # as POST /projects answered, by project id
    homes: dict[str, Server]
    killed: set[str] = field(default_factory=set)  # operations a kill interrupted
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
                with psycopg.connect(trio.uri(pid), autocommit=True, connect_timeout=30) as conn:
                    conn.execute(
                        "CREATE TABLE t AS SELECT g AS v FROM generate_series(1, %s) g", [ROWS]
                    )
            yield trio
        finally:
            for api in apis:
                api.http.close()


@dataclass
class Started:
    """What a case started: the project, its operations, and what to check once C is back."""

    pid: str
    op_ids: list[str]
    check: Callable[[dict[Path, int]], None] = lambda _: None
    gone: bool = False  # the project is deleted: its directory goes too


def kill_during(trio: Trio, failpoint: str, *, see_down: bool = False, **env: str) -> None:
    """Node C killed at ``failpoint`` inside the case's operation; the rest, as the module's
    docstring says. ``see_down``: also wait until the others see C down, and check that data-plane
    work on C's project is then refused, retryably, naming C. ``env``: for C's armed run."""
    c = trio.c
    c.stop()
    c.env.update(env, PGPLANE_FAILPOINTS=failpoint)
    # C's log is appended to across its restarts: the failpoint is reached once more than now.
    needle = f"failpoint {failpoint} reached"
    reached = c.log().count(needle)
    c.start()
    started = CASES[failpoint](trio)
    c.wait_for_log(needle, times=reached + 1, timeout=120)
    c.stop(signal.SIGKILL)
    at_kill = _settled_postmasters(c.data_dir / "projects" / started.pid)
    running = store_sql(c).rows(
        "SELECT id FROM operations WHERE project_id = ? AND status = 'running'", [started.pid]
    )
    assert len(running) == 1, running  # the one the failpoint holds
    trio.killed.add(running[0][0])

    _others_keep_serving(trio, started.pid, see_down=see_down)

    for name in (*env, "PGPLANE_FAILPOINTS"):
        c.env.pop(name)
    c.start()
    if started.gone:
        ops = _store_ops(c, started.op_ids)
    else:
        ops = trio.apis[0].wait_operations(started.pid, started.op_ids, timeout=120)
    assert [o["status"] for o in ops] == ["finished"] * len(ops), (ops, c.log()[-4000:])
    started.check(at_kill)
    _assert_attempted_once_on_c(trio, started.pid)
    # A fresh process: its figures are what it finished since it came back, no more (the page
    # is rendered once a second at most: waited for, then it must stay so).
    expected = Counter(o["action"] for o in ops)

    def counted() -> dict[str, int]:
        return {action: n for action, n in finished_ops(c).items() if n}

    with contextlib.suppress(AssertionError):
        wait_for("C's /metrics counting its operations", lambda: counted() == expected, 10)
    assert counted() == expected, (counted(), expected)
    if started.gone:
        assert not any((s.data_dir / "projects" / started.pid).exists() for s in trio.servers)
        return
    assert home(trio.servers, started.pid) is c
    assert_consistent(c, trio.api(c), started.pid)


def _store_ops(server: Server, op_ids: list[str]) -> list[dict[str, Any]]:
    """Operations of a deleted project (the API answers 404 for it), once settled, from the
    store."""
    marks = ", ".join("?" for _ in op_ids)
    query = f"SELECT id, action, status FROM operations WHERE id IN ({marks})"  # noqa: S608
    db = store_sql(server)

    def settled() -> list[tuple[Any, ...]] | None:
        rows = db.rows(query, op_ids)
        return rows if all(r[2] in ("finished", "failed") for r in rows) else None

    rows = wait_for("the deleted project's operations settled", settled, 120, server=server)
    return [{"id": r[0], "action": r[1], "status": r[2]} for r in rows]


def _settled_postmasters(project_dir: Path) -> dict[Path, int]:
    """The postmasters of the project once they stop changing (killed just after a spawn, the
    sandbox may not have exec'd postgres yet), as tests/crash.py takes them."""
    seen, deadline = postmaster_pids(project_dir), time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = postmaster_pids(project_dir)
        if now == seen:
            break
        seen = now
    return seen


def _others_keep_serving(trio: Trio, victim: str, *, see_down: bool) -> None:
    """With C dead: work on A's and B's projects is asked of each other's API and finishes,
    their computes answer, and C's project is read from the store through A and B."""
    on_a, on_b = trio.on(trio.a)[0], trio.on(trio.b)[0]

    def branch(api: Api, pid: str) -> None:
        r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": trio.name("w")}})
        api.settled(pid, r)

    with ThreadPoolExecutor(2) as pool:
        done = [
            pool.submit(branch, trio.api(trio.b), on_a),
            pool.submit(branch, trio.api(trio.a), on_b),
        ]
        for future in done:
            future.result()
    for pid in (on_a, on_b):
        with psycopg.connect(trio.uri(pid), connect_timeout=10) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (ROWS,)
    for api in (trio.api(trio.a), trio.api(trio.b)):
        r = api.http.get(f"/projects/{victim}/operations")
        if r.status_code != 404:  # a project being deleted is gone from the API already
            assert r.status_code == 200, r.text
            assert "running" in {o["status"] for o in r.json()["operations"]}
    if not see_down:
        return
    wait_down(trio.a, node_of(trio.c))
    api = trio.api(trio.a)
    names = [b["name"] for b in api.http.get(f"/projects/{victim}/branches").json()["branches"]]
    r = api.http.post(f"/projects/{victim}/branches", json={"branch": {"name": "refused"}})
    assert r.status_code == 503, r.text
    assert int(r.headers["Retry-After"]) >= 1
    assert "node-c is down" in r.json()["message"]
    after = [b["name"] for b in api.http.get(f"/projects/{victim}/branches").json()["branches"]]
    assert after == names  # refused: nothing written


def _assert_attempted_once_on_c(trio: Trio, pid: str) -> None:
    """Each operation of the project, from the store, attempted on C only: once, or twice when
    a kill interrupted it."""
    ran = attempts_everywhere(trio.servers)
    ids = [r[0] for r in store_sql(trio.c).rows(
        "SELECT id FROM operations WHERE project_id = ?", [pid]
    )]  # fmt: skip
    for op_id in ids:
        where = {node: counts[op_id] for node, counts in ran.items() if counts[op_id]}
        assert where == {"node-c": 2 if op_id in trio.killed else 1}, (op_id, where)


def _rows(uri: str) -> tuple[int, int]:
    with psycopg.connect(uri, connect_timeout=60) as conn:
        row = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _starts(api: Api, pid: str) -> int:
    return sum(o["action"] == "start_compute" for o in api.operations(pid))


def _pgdata(trio: Trio, pid: str, branch_id: str) -> Path:
    return trio.c.data_dir / "projects" / pid / "branches" / branch_id / "pgdata"


# -- the cases: one per kind of operation, each started on a project of C's ---------------------


def _branch(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    parent = _pgdata(trio, pid, trio.main_branch(pid))
    api = trio.api(trio.b)
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": trio.name("copied")}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    branch_id = r.json()["branch"]["id"]

    def check(at_kill: dict[Path, int]) -> None:
        # The copy was put in place once: one "branched" line for it in all three logs.
        placed = sum(s.log().count(f"/branches/{branch_id}/pgdata from") for s in trio.servers)
        assert placed == 1, placed
        assert postmaster_pids(parent.parents[2])[parent] == at_kill[parent]  # parent untouched
        assert _rows(trio.uri(pid, branch_id=branch_id)) == (ROWS, SUM)
        assert _rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _start(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    api.suspend(pid, eid)
    starts = _starts(api, pid)
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/start")
    assert r.status_code == 200, r.text
    pgdata = _pgdata(trio, pid, trio.main_branch(pid))

    def check(at_kill: dict[Path, int]) -> None:
        assert api.endpoint(pid, eid)["current_state"] == "active"
        # The postmaster spawned before the kill serves: started once, adopted after.
        assert postmaster_pids(pgdata.parents[2])[pgdata] == at_kill[pgdata]
        assert _starts(api, pid) == starts + 1
        assert _rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _suspend(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    starts = _starts(api, pid)
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert api.endpoint(pid, eid)["current_state"] == "idle"
        assert _starts(api, pid) == starts  # suspended by the retry, not started again
        assert postmaster_pids(trio.c.data_dir / "projects" / pid) == {}

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _role(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api, name = trio.api(trio.b), trio.name("app").replace("-", "_")
    roles = f"/projects/{pid}/branches/{trio.main_branch(pid)}/roles"
    r = api.http.post(roles, json={"role": {"name": name}})
    assert r.status_code == 201, r.text

    def check(_: dict[Path, int]) -> None:
        listed = [x["name"] for x in api.http.get(roles).json()["roles"]]
        assert listed.count(name) == 1
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            found = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [name])
            assert found.fetchone() == (1,)
        with psycopg.connect(trio.uri(pid, role=name), connect_timeout=60) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (name,)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _settings(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{eid}",
        json={"endpoint": {"settings": {"pg_settings": {"work_mem": "12MB"}}}},
    )
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("12MB",)
        assert _rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _project(trio: Trio) -> Started:
    body = create_on(trio.c, trio.servers, trio.api(trio.a), trio.name("born"))
    pid = body["project"]["id"]
    trio.projects[pid], trio.homes[pid] = body, trio.c

    def check(_: dict[Path, int]) -> None:
        api = trio.api(trio.b)
        assert [o["action"] for o in api.operations(pid)].count("start_compute") == 1
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("neondb",)

    return Started(pid, [o["id"] for o in body["operations"]], check)


def _delete_branch(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api = trio.api(trio.b)
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": trio.name("doomed")}, "endpoints": [{"type": "read_write"}]},
    )
    branch_id = api.settled(pid, r)["branch"]["id"]
    r = api.http.delete(f"/projects/{pid}/branches/{branch_id}")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert not _pgdata(trio, pid, branch_id).parent.exists()
        listed = [b["id"] for b in api.http.get(f"/projects/{pid}/branches").json()["branches"]]
        assert branch_id not in listed

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _delete_project(trio: Trio) -> Started:
    api = trio.api(trio.a)
    body = create_on(trio.c, trio.servers, api, trio.name("short"))
    pid = body["project"]["id"]
    api.wait_operations(pid, [o["id"] for o in body["operations"]], 120)
    r = api.http.delete(f"/projects/{pid}")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert api.http.get(f"/projects/{pid}").status_code == 404
        assert all(pid not in {p["id"] for p in x.http.get("/projects").json()["projects"]}
                   for x in trio.apis)  # fmt: skip

    return Started(pid, [o["id"] for o in r.json()["operations"]], check, gone=True)


def _snapshot(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api = trio.api(trio.b)
    r = api.http.post(f"/projects/{pid}/branches/{trio.main_branch(pid)}/snapshot")
    assert r.status_code in (200, 201), r.text
    snapshot_id = r.json()["snapshot"]["id"]

    def check(_: dict[Path, int]) -> None:
        listed = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
        assert [s["id"] for s in listed].count(snapshot_id) == 1

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


CASES: dict[str, Callable[[Trio], Started]] = {
    "create_branch:copied": _branch,
    "start_compute:spawned": _start,
    "stop_compute:signalled": _suspend,
    "apply_config:executed": _role,
    "restart_compute:signalled": _settings,
    "create_timeline:populated": _project,
    "delete_timeline:stopped": _delete_branch,
    "delete_tenant:stopped": _delete_project,
    "create_snapshot:built": _snapshot,
    # The work done, the store not told: the retry must find it done and not do it again.
    "after:create_branch": _branch,
    "after:start_compute": _start,
}
