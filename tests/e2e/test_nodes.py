"""Two nodes on one PostgreSQL store: two `serve` processes with data directories and ports of
their own, as two machines would run them.

New projects spread over both; each project's computes and data are on its node only; every
operation ran exactly once, on its project's node (counted in both logs and on both /metrics);
`nodes list` shows both; a cordoned node gets no new project; and once one node is killed, its
projects' data-plane requests are refused with a retryable 503 naming it, reads are still
answered, and the other node keeps serving its own projects.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.pgstore import store_cluster
from tests.support import Api, Server, run_cli, running_server, wait_for

# Fast heartbeats: a killed node is seen down within seconds.
_NODE_ENV = {"PGPLANE_NODE_HEARTBEAT_SECONDS": "0.3", "PGPLANE_NODE_LEASE_SECONDS": "2"}


@contextlib.contextmanager
def _two_nodes() -> Iterator[tuple[Server, Server]]:
    url = store_cluster().database()
    with (
        running_server(store=url, PGPLANE_NODE_NAME="node-a", **_NODE_ENV) as a,
        running_server(store=url, PGPLANE_NODE_NAME="node-b", **_NODE_ENV) as b,
    ):
        yield a, b


def _nodes(server: Server) -> dict[str, dict[str, Any]]:
    done = run_cli("nodes", "list", "--json", data_dir=server.data_dir, env=server.env)
    assert done.returncode == 0, done.stderr
    return {n["name"]: n for n in json.loads(done.stdout)["nodes"]}


def _cli(server: Server, *argv: str) -> None:
    done = run_cli(*argv, data_dir=server.data_dir, env=server.env)
    assert done.returncode == 0, done.stderr


def _home(servers: tuple[Server, Server], project_id: str) -> Server:
    """The node whose data directory holds the project (and only that one's)."""
    homes = [s for s in servers if (s.data_dir / "projects" / project_id).exists()]
    assert len(homes) == 1, (project_id, homes)
    return homes[0]


def _finished_ops(server: Server) -> dict[str, int]:
    """pgplane_operations_total{status="finished"} by action, on this node's /metrics."""
    r = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "pgplane_operations_total" and sample.labels["status"] == "finished":
                counts[sample.labels["action"]] = int(sample.value)
    return counts


def _attempts(server: Server) -> list[str]:
    """The ids of the operation attempts this node ran, from its log."""
    return re.findall(r"operation (\S+) \S+ \(\S+\) attempt \d+", server.log())


def test_two_nodes_share_the_platform_and_one_killed_refuses_only_its_projects() -> None:
    with _two_nodes() as servers:
        a, b = servers
        _, key = a.create_key("nodes@example.com")
        listed = _nodes(a)
        assert set(listed) == {"node-a", "node-b"}
        assert {n["state"] for n in listed.values()} == {"active"}

        # Four projects, asked of either node's API: two placed on each.
        apis = (Api(a, key), Api(b, key))
        projects = [apis[i % 2].create_ready_project(name=f"p{i}") for i in range(4)]
        homes = {p["project"]["id"]: _home(servers, p["project"]["id"]) for p in projects}
        assert sorted(h.data_dir.name for h in homes.values()).count(a.data_dir.name) == 2
        listed = _nodes(b)
        assert [listed[n]["projects"] for n in ("node-a", "node-b")] == [2, 2]
        assert [listed[n]["computes"] for n in ("node-a", "node-b")] == [2, 2]

        _assert_served_once_on_their_nodes(servers, apis, projects, homes)

        # A read of a project's data itself (its schema) is served by its node; another node
        # says where the data is (no forwarding between nodes yet).
        on_a = next(pid for pid, home in homes.items() if home is a)
        on_b = next(pid for pid, home in homes.items() if home is b)
        branch_b = next(p["branch"]["id"] for p in projects if p["project"]["id"] == on_b)
        schema = f"/projects/{on_b}/branches/{branch_b}/schema"
        r = apis[1].http.get(schema, params={"db_name": "neondb"})
        assert r.status_code == 200, r.text
        r = apis[0].http.get(schema, params={"db_name": "neondb"})
        assert r.status_code == 503, r.text
        assert "on node node-b" in r.json()["message"]

        # A cordoned node gets no new project; uncordoned, it takes them again.
        _cli(a, "nodes", "cordon", "node-a")
        assert _nodes(b)["node-a"]["state"] == "cordoned"
        for i in range(2):
            body = apis[i].create_project(name=f"cordoned{i}")
            assert _home_of_new(servers, body) is b
        _cli(b, "nodes", "uncordon", "node-a")
        assert _nodes(a)["node-a"]["state"] == "active"

        # node-b killed: it shows down once its lease lapses.
        b.stop(signal.SIGKILL)
        wait_for("node-b seen down", lambda: _nodes(a)["node-b"]["state"] == "down" or None)

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
        assert _home_of_new((a, b), body) is a
        # node-a keeps serving its own.
        r = api.http.post(
            f"/projects/{on_a}/branches",
            json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
        )
        api.settled(on_a, r)
        for client in apis:
            client.http.close()


def _assert_served_once_on_their_nodes(
    servers: tuple[Server, Server],
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
    ran = {s.data_dir.name: _attempts(s) for s in servers}
    for p in projects:
        pid = p["project"]["id"]
        for op in apis[0].operations(pid):
            where = [name for name, ids in ran.items() for i in ids if i == op["id"]]
            assert where == [homes[pid].data_dir.name], (op, where)
    for s in servers:
        assert _finished_ops(s).get("create_timeline") == 2


def _home_of_new(servers: tuple[Server, Server], body: dict[str, Any]) -> Server:
    """Where a project just created was placed: its first operation's node makes its data."""
    pid = body["project"]["id"]
    return wait_for(
        "the new project's data",
        lambda: next((s for s in servers if (s.data_dir / "projects" / pid).exists()), None),
    )


@pytest.mark.slow
def test_a_killed_node_restarted_takes_its_name_back_and_its_projects_converge() -> None:
    with _two_nodes() as servers:
        a, b = servers
        _, key = a.create_key("restart@example.com")
        with Api(a, key) as api:
            # Two projects: one on each node (the second goes to the less loaded one).
            first = api.create_ready_project(name="one")
            second = api.create_ready_project(name="two")
            by_home = {_home(servers, p["project"]["id"]).data_dir: p for p in (first, second)}
            pid = by_home[b.data_dir]["project"]["id"]
            # A branch asked of node-b's project, and node-b killed before or while it runs.
            r = api.http.post(
                f"/projects/{pid}/branches",
                json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
            )
            assert r.status_code == 201, r.text
            b.stop(signal.SIGKILL)
            wait_for("node-b seen down", lambda: _nodes(a)["node-b"]["state"] == "down" or None)
            # Back on the same data directory: the same node, its lease taken back at once, and
            # what it left unfinished finished.
            b.start()
            assert _nodes(a)["node-b"]["state"] == "active"
            api.settled(pid, r)
            r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "again"}})
            api.settled(pid, r)
            assert len(_nodes(a)) == 2
