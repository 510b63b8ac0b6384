"""Two nodes on one PostgreSQL store: two `serve` processes with data directories and ports of
their own, as two machines would run them.

New projects spread over both; each project's computes and data are on its node only; every
operation ran exactly once, on its project's node (counted in both logs and on both /metrics);
`nodes list` shows both; a cordoned node gets no new project; and once one node is killed, its
projects' data-plane requests are refused with a retryable 503 naming it, reads are still
answered, and the other node keeps serving its own projects.
"""

from __future__ import annotations

import signal
from typing import Any

import psycopg
import pytest

from tests.nodes import (
    attempts,
    cli,
    finished_ops,
    home,
    home_of_new,
    nodes,
    running_nodes,
    wait_down,
)
from tests.support import Api, Server


# The three-node suite checks the same in CI (spread, each operation once on its node, nodes list,
# a cordon, a node down refused by name): this one runs with -m slow.
@pytest.mark.slow
def test_two_nodes_share_the_platform_and_one_killed_refuses_only_its_projects() -> None:
    with running_nodes(2) as servers:
        a, b = servers
        _, key = a.create_key("nodes@example.com")
        listed = nodes(a)
        assert set(listed) == {"node-a", "node-b"}
        assert {n["state"] for n in listed.values()} == {"active"}

        # Four projects, asked of either node's API: two placed on each.
        apis = (Api(a, key), Api(b, key))
        projects = [apis[i % 2].create_ready_project(name=f"p{i}") for i in range(4)]
        homes = {p["project"]["id"]: home(servers, p["project"]["id"]) for p in projects}
        assert sorted(h.data_dir.name for h in homes.values()).count(a.data_dir.name) == 2
        listed = nodes(b)
        assert [listed[n]["projects"] for n in ("node-a", "node-b")] == [2, 2]
        assert [listed[n]["computes"] for n in ("node-a", "node-b")] == [2, 2]

        _assert_served_once_on_theirnodes(servers, apis, projects, homes)

        # A read of a project's data itself (its schema) is served by its node, whichever
        # node's API is asked (the other asks it over the node channel).
        on_a = next(pid for pid, home in homes.items() if home is a)
        on_b = next(pid for pid, home in homes.items() if home is b)
        branch_b = next(p["branch"]["id"] for p in projects if p["project"]["id"] == on_b)
        schema = f"/projects/{on_b}/branches/{branch_b}/schema"
        answers = [api.http.get(schema, params={"db_name": "neondb"}) for api in apis]
        assert [r.status_code for r in answers] == [200, 200], [r.text for r in answers]
        assert answers[0].json() == answers[1].json()

        # A cordoned node gets no new project; uncordoned, it takes them again.
        cli(a, "nodes", "cordon", "node-a")
        assert nodes(b)["node-a"]["state"] == "cordoned"
        for i in range(2):
            body = apis[i].create_project(name=f"cordoned{i}")
            assert home_of_new(servers, body) is b
        cli(b, "nodes", "uncordon", "node-a")
        assert nodes(a)["node-a"]["state"] == "active"

        # node-b killed: it shows down once its lease lapses.
        b.stop(signal.SIGKILL)
        wait_down(a, "node-b")

        api = apis[0]
        # Its project: read from the store, data-plane work refused, retryable, naming it.
        assert api.http.get(f"/projects/{on_b}").status_code == 200
        assert api.http.get(f"/projects/{on_b}/branches").status_code == 200
        r = api.http.post(f"/projects/{on_b}/branches", json={"branch": {"name": "dev"}})
        assert r.status_code == 503, r.text
        assert r.headers["Retry-After"]
        assert "node-b is down" in r.json()["message"]
        r = api.http.get(schema, params={"db_name": "neondb"})
        assert r.status_code == 503, r.text
        assert "node-b is down" in r.json()["message"]
        # A new project goes to the node that is up.
        body = api.create_project(name="after")
        assert home_of_new((a, b), body) is a
        # node-a keeps serving its own.
        r = api.http.post(
            f"/projects/{on_a}/branches",
            json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
        )
        api.settled(on_a, r)
        for client in apis:
            client.http.close()


def _assert_served_once_on_theirnodes(
    servers: tuple[Server, ...],
    apis: tuple[Api, Api],
    projects: list[dict[str, Any]],
    homes: dict[str, Server],
) -> None:
    """Each compute answers through its node's proxy; each operation ran there, once."""
    # Each compute answers, through its own node's proxy.
    for p in projects:
        pid = p["project"]["id"]
        api = apis[servers.index(homes[pid])]
        r = api.http.get(
            f"/projects/{pid}/connection_uri",
            params={"role_name": "neondb_owner", "database_name": "neondb"},
        )
        assert r.status_code == 200, r.text
        with psycopg.connect(r.json()["uri"], connect_timeout=10) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)

    # Every operation ran once, on its project's node: one attempt in all the logs, and the
    # node's /metrics count it.
    ran = {s.data_dir.name: attempts(s) for s in servers}
    for p in projects:
        pid = p["project"]["id"]
        for op in apis[0].operations(pid):
            where = [name for name, ids in ran.items() for i in ids if i == op["id"]]
            assert where == [homes[pid].data_dir.name], (op, where)
    for s in servers:
        assert finished_ops(s).get("create_timeline") == 2


@pytest.mark.slow
def test_a_killed_node_restarted_takes_its_name_back_and_its_projects_converge() -> None:
    with running_nodes(2) as servers:
        a, b = servers
        _, key = a.create_key("restart@example.com")
        with Api(a, key) as api:
            # Two projects: one on each node (the second goes to the less loaded one).
            first = api.create_ready_project(name="one")
            second = api.create_ready_project(name="two")
            by_home = {home(servers, p["project"]["id"]).data_dir: p for p in (first, second)}
            pid = by_home[b.data_dir]["project"]["id"]
            # A branch asked of node-b's project, and node-b killed before or while it runs.
            r = api.http.post(
                f"/projects/{pid}/branches",
                json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
            )
            assert r.status_code == 201, r.text
            b.stop(signal.SIGKILL)
            wait_down(a, "node-b")
            # Back on the same data directory: the same node, its lease taken back at once, and
            # what it left unfinished finished.
            b.start()
            assert nodes(a)["node-b"]["state"] == "active"
            api.settled(pid, r)
            r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "again"}})
            api.settled(pid, r)
            assert len(nodes(a)) == 2
