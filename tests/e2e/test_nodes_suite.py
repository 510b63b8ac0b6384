"""Three nodes on one PostgreSQL store: three `serve` processes with data directories and ports
of their own, as three machines would run them (tests/nodes.py).

- Projects spread over the three, whichever node's API is asked; each is served by its node.
- A key revoked through node B is refused by node A on the very next request, and by node C.
- /metrics on two nodes: the operations a test ran through a third node's API are counted on
  the node that ran them, and only there.
- SIGKILL of node C in the middle of each kind of operation (a failpoint inside its handler,
  see tests/crash.py): while C is down the other nodes keep serving (their own projects' work
  runs, C's projects are read); once C returns, every operation is finished, and each handler's
  effect is counted, not assumed: each operation attempted on C only, once (twice for the one
  the kill interrupted: the killed attempt and its retry), its project's data on C only, each
  copy made into place once ("branched …" in the three logs), each compute served by one
  postmaster (the one that ran through the kill), every role and row once, and C's /metrics,
  fresh since its restart, counting exactly the operations it finished. CI kills at two steps;
  ``-m slow`` at every kind (tests/e2e/test_nodes_suite_kills.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import psycopg
import pytest

from pgplane.core.operations import Action
from tests.nodekill import kill_during
from tests.nodekill_cases import CASES, ELSEWHERE
from tests.nodes import finished_ops, home, node_of, nodes
from tests.support import wait_for
from tests.trio import ROWS, Trio, trio_of


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    with trio_of() as three:
        yield three


def test_projects_spread_over_the_three_nodes_each_served_by_its_own(trio: Trio) -> None:
    listed = nodes(trio.a)
    assert {n: (x["projects"], x["computes"]) for n, x in listed.items()} == {
        "node-a": (2, 2),
        "node-b": (2, 2),
        "node-c": (2, 2),
    }
    assert {n["state"] for n in listed.values()} == {"active"}
    for pid, server in trio.homes.items():
        assert home(trio.servers, pid) is server  # its data there, and on no other node
        with psycopg.connect(trio.uri(pid), connect_timeout=10) as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone() == (ROWS,)


def test_a_key_revoked_through_one_node_is_refused_by_another_at_the_next_request(
    trio: Trio,
) -> None:
    a, b, c = trio.apis
    created = a.http.post("/api_keys", json={"key_name": "short-lived"})
    assert created.status_code == 200, created.text
    key, key_id = created.json()["key"], created.json()["id"]
    headers = {"Authorization": f"Bearer {key}"}
    for client in (a, c):
        assert client.http.get("/projects", headers=headers).status_code == 200
    r = b.http.delete(f"/api_keys/{key_id}")
    assert r.status_code == 200, r.text
    # The very next request, on each of the other nodes: no cache anywhere.
    for client in (a, c):
        refused = client.http.get("/projects", headers=headers)
        assert refused.status_code == 401, refused.text
        assert refused.json()["code"]
    assert b.http.delete(f"/api_keys/{key_id}").status_code == 404


def test_metrics_on_two_nodes_count_the_operations_each_ran(trio: Trio) -> None:
    """Branches and a role asked of node C's API for projects of A and B: A and B count what
    they ran, C counts none of it."""
    on_a, on_b = trio.on(trio.a)[0], trio.on(trio.b)[0]
    before = {node_of(s): finished_ops(s) for s in trio.servers}
    through_c = trio.api(trio.c)
    for pid, name in ((on_a, "metered-a"), (on_b, "metered-b")):
        r = through_c.http.post(f"/projects/{pid}/branches", json={"branch": {"name": name}})
        through_c.settled(pid, r)
    r = through_c.http.post(
        f"/projects/{on_b}/branches/{trio.main_branch(on_b)}/roles",
        json={"role": {"name": "metered"}},
    )
    through_c.settled(on_b, r)
    expected = {
        "node-a": {"create_branch": 1},
        "node-b": {"create_branch": 1, "apply_config": 1},
        "node-c": {},
    }

    def ran() -> dict[str, dict[str, int]]:
        counted = {node_of(s): finished_ops(s) for s in trio.servers}
        return {
            node: {
                k: v - before[node].get(k, 0) for k, v in now.items() if v != before[node].get(k)
            }
            for node, now in counted.items()
        }

    # The page is rendered once a second at most: waited for; more than that fails too.
    wait_for("the operations counted on their nodes", lambda: ran() == expected, 10)


def test_node_c_killed_while_it_copies_a_branch(trio: Trio) -> None:
    kill_during(trio, "create_branch:copied", see_down=True)


def test_node_c_killed_while_a_compute_starts(trio: Trio) -> None:
    kill_during(trio, "start_compute:spawned")


def test_every_kind_of_operation_has_a_kill_case() -> None:
    """A new action joins the kill suite: a case here, or a named test that kills inside it."""
    covered = {case.action for case in CASES.values()}
    for action, (module, test) in ELSEWHERE.items():
        assert callable(getattr(importlib.import_module(module), test)), (action, module, test)
        covered.add(action)
    assert covered == set(Action)
