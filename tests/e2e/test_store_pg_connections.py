"""The PostgreSQL store's connections, on a cluster of the test's own (it is restarted here):
a node holds no more than ``PGPLANE_STORE_POOL_SIZE`` of them (and its listener), named after
it; a restart of the store's server, fast or immediate, costs no request an error; and a test
process killed outright takes its store cluster with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.pgstore import StoreCluster, new_cluster, sweep_orphans
from tests.support import PGPLANE, Api, Server, running_server, wait_for

POOL = 3
NODE = "pool-node"
# Nothing in the background takes a connection while the test looks: the engine's polling, the
# scheduler's ticks and the heartbeat are minutes apart (LISTEN still wakes the engine).
QUIET = {
    "PGPLANE_POLL_SECONDS": "600",
    "PGPLANE_SCHEDULER_SECONDS": "600",
    "PGPLANE_NODE_HEARTBEAT_SECONDS": "300",
    "PGPLANE_NODE_LEASE_SECONDS": "900",
    "PGPLANE_KEY_USE_FLUSH_SECONDS": "600",
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[StoreCluster]:
    own = new_cluster()
    yield own
    own.stop()


@pytest.fixture(scope="module")
def pooled(cluster: StoreCluster) -> Iterator[tuple[Server, Api, str]]:
    with running_server(
        store=cluster.database(),
        PGPLANE_STORE_POOL_SIZE=str(POOL),
        PGPLANE_NODE_NAME=NODE,
        **QUIET,
    ) as srv:
        _, key = srv.create_key("pool@example.com")
        with Api(srv, key) as api:
            pid = api.create_ready_project(name="pooled")["project"]["id"]
            yield srv, api, pid


def _node_connections(cluster: StoreCluster) -> int:
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [f"pgplane {NODE}"],
        ).fetchone()
    assert row is not None
    return int(row[0])


def _burst(api: Api, pid: str, requests: int = 60) -> list[int]:
    """Statuses of ``requests`` operation pages asked 12 at a time (four times the pool), each
    on its own connection to the API (its requests truly at once)."""

    def page(_: int) -> int:
        with httpx.Client(
            base_url=api.server.base_url, headers=api.http.headers, timeout=60
        ) as client:
            return client.get(f"/projects/{pid}/operations").status_code

    with ThreadPoolExecutor(12) as pool:
        return list(pool.map(page, range(requests)))


def test_a_node_holds_its_pool_size_of_connections_named_after_it(
    pooled: tuple[Server, Api, str], cluster: StoreCluster
) -> None:
    _, api, pid = pooled
    assert set(_burst(api, pid)) == {200}
    # The pool and the engine's listener, however many requests came at once.
    held = _node_connections(cluster)
    assert 2 <= held <= POOL + 1, held


@pytest.mark.parametrize("how", ["fast", "immediate"])
def test_a_restart_of_the_store_costs_no_request_an_error(
    pooled: tuple[Server, Api, str], cluster: StoreCluster, how: str
) -> None:
    _, api, pid = pooled
    assert set(_burst(api, pid)) == {200}  # the pool full of connections the restart will end
    if how == "fast":
        cluster.restart()
    else:  # as after a crash of the server: every backend ended at once
        cluster.halt(signal.SIGQUIT)
        cluster.boot()
    # One at a time first: each would meet a connection the restart ended, if any were used.
    statuses = [api.http.get(f"/projects/{pid}/operations").status_code for _ in range(POOL * 2)]
    assert statuses == [200] * (POOL * 2)
    assert set(_burst(api, pid)) == {200}
    r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": f"after-{how}"}})
    api.settled(pid, r)


def test_a_pool_of_no_connections_is_refused_at_start(tmp_path: Path) -> None:
    done = subprocess.run(
        [*PGPLANE, "serve", "--data-dir", str(tmp_path), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PGPLANE_STORE_POOL_SIZE": "0"},
    )
    assert done.returncode == 2, done.stderr
    assert "PGPLANE_STORE_POOL_SIZE" in done.stderr


_HOLDER = """
import sys, time
sys.path.insert(0, sys.argv[1])
from tests.pgstore import new_cluster
cluster = new_cluster()
print(cluster.postmaster_pid, cluster.root, flush=True)
time.sleep(600)
"""


def test_a_test_process_killed_outright_takes_its_store_cluster_with_it() -> None:
    root = Path(__file__).resolve().parents[2]
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(root)], stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout is not None
            pid_text, data = holder.stdout.readline().split()
        finally:
            holder.kill()
    postmaster, left = int(pid_text), Path(data)
    assert left.is_relative_to(tempfile.gettempdir())

    def gone() -> bool:
        try:
            os.kill(postmaster, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for("the killed process' postmaster gone", gone)
    # What it left on disk goes with the next cluster any test process starts.
    assert left.exists()
    sweep_orphans()
    assert not left.exists()
