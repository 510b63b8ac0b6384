"""Several nodes on one PostgreSQL store, as several machines would run them: `serve` processes
with data directories and ports of their own, and what the multi-node suites ask of them."""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.pgstore import store_cluster
from tests.support import Api, Server, run_cli, running_server, wait_for

# Fast heartbeats: a killed node is seen down within seconds.
NODE_ENV = {"PGPLANE_NODE_HEARTBEAT_SECONDS": "0.3", "PGPLANE_NODE_LEASE_SECONDS": "2"}
NAMES = ("node-a", "node-b", "node-c")


@contextlib.contextmanager
def running_nodes(
    count: int = 2, prepare: Mapping[str, Callable[[Path], None]] | None = None, **env: str
) -> Iterator[tuple[Server, ...]]:
    """``count`` nodes (``node-a``, ``node-b``…, started in that order) on a fresh database of
    the test store cluster; ``prepare``, by node name, sees a node's data directory first;
    ``env`` for each (its heartbeat and lease too, over the fast ones of ``NODE_ENV``)."""
    url = store_cluster().database()
    prepare = prepare or {}
    with contextlib.ExitStack() as stack:
        yield tuple(
            stack.enter_context(
                running_server(
                    prepare=prepare.get(name),
                    store=url,
                    PGPLANE_NODE_NAME=name,
                    **{**NODE_ENV, **env},
                )
            )
            for name in NAMES[:count]
        )


def nodes(server: Server) -> dict[str, dict[str, Any]]:
    """``pgplane nodes list --json``, run against this node's store, by node name."""
    done = run_cli("nodes", "list", "--json", data_dir=server.data_dir, env=server.env)
    assert done.returncode == 0, done.stderr
    return {n["name"]: n for n in json.loads(done.stdout)["nodes"]}


def cli(server: Server, *argv: str) -> None:
    done = run_cli(*argv, data_dir=server.data_dir, env=server.env)
    assert done.returncode == 0, done.stderr


def home(servers: Sequence[Server], project_id: str) -> Server:
    """The node whose data directory holds the project (and only that one's)."""
    homes = [s for s in servers if (s.data_dir / "projects" / project_id).exists()]
    assert len(homes) == 1, (project_id, homes)
    return homes[0]


def home_of_new(servers: Sequence[Server], body: dict[str, Any]) -> Server:
    """Where a project just created was placed: its first operation's node makes its data."""
    pid = body["project"]["id"]
    return wait_for(
        "the new project's data",
        lambda: next((s for s in servers if (s.data_dir / "projects" / pid).exists()), None),
    )


def finished_ops(server: Server) -> dict[str, int]:
    """pgplane_operations_total{status="finished"} by action, on this node's /metrics."""
    r = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    counts: dict[str, int] = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            if sample.name == "pgplane_operations_total" and sample.labels["status"] == "finished":
                counts[sample.labels["action"]] = int(sample.value)
    return counts


def attempts(server: Server) -> list[str]:
    """The ids of the operation attempts this node ran, from its log."""
    return re.findall(r"operation (\S+) \S+ \(\S+\) attempt \d+", server.log())


def wait_down(observer: Server, name: str) -> None:
    wait_for(f"{name} seen down", lambda: nodes(observer)[name]["state"] == "down" or None)


def attempts_everywhere(servers: Sequence[Server]) -> dict[str, Counter[str]]:
    """Each node's attempts, by operation id, from its log (every run of it on that data
    directory: the log is appended to across restarts)."""
    return {node_of(s): Counter(attempts(s)) for s in servers}


def node_of(server: Server) -> str:
    return server.env["PGPLANE_NODE_NAME"]


def create_on(target: Server, servers: Sequence[Server], api: Api, name: str) -> dict[str, Any]:
    """A project placed on ``target`` as an operator would have it: every other node cordoned
    while it is created, uncordoned after. Its operations are left to run."""
    others = [node_of(s) for s in servers if s is not target]
    for node in others:
        cli(target, "nodes", "cordon", node)
    try:
        return api.create_project(name=name)
    finally:
        for node in others:
            cli(target, "nodes", "uncordon", node)
