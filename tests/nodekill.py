"""Three nodes, and node C killed in the middle of an operation: the multi-node suites' harness
(tests/e2e/test_nodes_suite*.py).

A case (tests/nodekill_cases.py) starts one kind of operation on a project of C's, through
another node's API, with a failpoint armed on C; C is SIGKILLed once its log says the failpoint
was reached. While C is down, the other nodes' own projects keep working and C's projects are
still read. C is started again (same data directory, same name) and what its handler did is
counted, not assumed:

- every operation of the project was attempted on C and on no other node, once each, and
  twice the one the kill interrupted (its killed attempt and the retry), never at once;
- C's /metrics, fresh since the restart, count exactly the operations it finished since (the
  case's, and any other work of C's projects the kill left unfinished, a scheduler's job);
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg

from tests.crash import assert_consistent, postmaster_pids
from tests.nodekill_cases import CASES
from tests.nodes import attempts_everywhere, finished_ops, home, node_of, wait_down
from tests.stores import store_sql
from tests.support import Api, Server, wait_for
from tests.trio import ROWS, Trio


def kill_during(trio: Trio, failpoint: str, *, see_down: bool = False) -> None:
    """Node C killed at ``failpoint`` inside its case's operation; the rest, as the module's
    docstring says. ``see_down``: also wait until the others see C down, and check that data-plane
    work on C's project is then refused, retryably, naming C."""
    c, case = trio.c, CASES[failpoint]
    case.prepare(trio)
    c.stop()
    c.env.update(case.env, PGPLANE_FAILPOINTS=failpoint)
    # C's log is appended to across its restarts: the failpoint is reached once more than now.
    needle = f"failpoint {failpoint} reached"
    reached = c.log().count(needle)
    c.start()
    started = case.start(trio)
    c.wait_for_log(needle, times=reached + 1, timeout=120)
    c.stop(signal.SIGKILL)
    at_kill = _settled_postmasters(c.data_dir / "projects" / started.pid)
    db = store_sql(c)
    running = db.rows(
        "SELECT id, action FROM operations WHERE project_id = ? AND status = 'running'",
        [started.pid],
    )
    assert [r[1] for r in running] == [case.action.value], running  # the one the failpoint holds
    # C's other work the kill left unfinished (a scheduler's jobs on its other projects): it
    # runs again once C is back, and is counted with the case's.
    mine = {started.pid, *trio.on(c)}
    unsettled = [
        r for r in db.rows("SELECT id, project_id, status FROM operations") if r[1] in mine
        and r[2] not in ("finished", "failed")
    ]  # fmt: skip
    trio.killed.update(r[0] for r in unsettled if r[2] == "running")

    _others_keep_serving(trio, started.pid, see_down=see_down)

    for name in (*case.env, "PGPLANE_FAILPOINTS"):
        c.env.pop(name)
    c.start()
    if started.gone:
        ops = _store_ops(c, started.op_ids)
    else:
        ops = trio.apis[0].wait_operations(started.pid, started.op_ids, timeout=120)
    assert [o["status"] for o in ops] == ["finished"] * len(ops), (ops, c.log()[-4000:])
    others = _store_ops(c, [r[0] for r in unsettled if r[0] not in started.op_ids])
    assert [o["status"] for o in others] == ["finished"] * len(others), others
    _assert_attempted_once_on_c(trio, started.pid)
    # A fresh process: its figures are what it finished since it came back, no more (the page
    # is rendered once a second at most: waited for, then it must stay so).
    expected = Counter(o["action"] for o in [*ops, *others])

    def counted() -> dict[str, int]:
        return {action: n for action, n in finished_ops(c).items() if n}

    with contextlib.suppress(AssertionError):
        wait_for("C's /metrics counting its operations", lambda: counted() == expected, 10)
    assert counted() == expected, (counted(), expected)
    started.check(at_kill)  # after the counts: a check may wake a compute
    if started.gone:
        assert not any((s.data_dir / "projects" / started.pid).exists() for s in trio.servers)
        return
    if started.detached:
        assert not any((s.data_dir / "projects" / started.pid).exists() for s in trio.servers)
        assert (c.data_dir / "archive" / started.pid / "manifest.json").is_file()
        return
    assert home(trio.servers, started.pid) is c
    assert_consistent(c, trio.api(c), started.pid)


def _store_ops(server: Server, op_ids: list[str]) -> list[dict[str, Any]]:
    """Operations once settled, from the store (the API answers 404 for a deleted project's)."""
    if not op_ids:
        return []
    marks = ", ".join("?" for _ in op_ids)
    query = f"SELECT id, action, status FROM operations WHERE id IN ({marks})"  # noqa: S608
    db = store_sql(server)

    def settled() -> list[tuple[Any, ...]] | None:
        rows = db.rows(query, op_ids)
        return rows if all(r[2] in ("finished", "failed") for r in rows) else None

    rows = wait_for("the operations settled", settled, 120, server=server)
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
