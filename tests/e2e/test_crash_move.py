"""A node drained, and the node it leaves or the node it goes to SIGKILLed inside the move: after
the killed node restarts, every operation of the move finished, the project is on the other node
once, whole (every row), its compute running again, and nothing of it is left behind (no data on
the node it left, no archive on shared storage or on either node). And (``-m slow``) a node lost
for good, its project rebuilt on the other by `nodes recover`, that node killed inside the rebuild:
every row shipped is there once it is back."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.test_nodes_move import ENV, Pair, Storage, contents, fill
from tests.nodes import attempts, cli, home, running_nodes, wait_down
from tests.support import Api, Server, run_cli, wait_for


@pytest.fixture
def shared() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="pgplane-test-shared-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _restart(server: Server, failpoint: str | None) -> None:
    server.stop()
    if failpoint is None:
        server.env.pop("PGPLANE_FAILPOINTS", None)
    else:
        server.env["PGPLANE_FAILPOINTS"] = failpoint
    server.start()


# CI kills the node the project goes to (the node it leaves is killed inside a detach by
# test_crash_data.py on one node); -m slow at every other point, on both sides.
@pytest.mark.parametrize(
    ("killed", "failpoint"),
    [
        pytest.param("a", "tenant_detach:stored", marks=pytest.mark.slow),
        ("b", "tenant_reattach:fetched"),
    ],
)
def test_kill_inside_a_move(shared: Path, killed: str, failpoint: str) -> None:
    _kill_inside_a_move(shared, killed, failpoint)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("killed", "failpoint"),
    [
        ("a", "tenant_detach:packed"),
        ("a", "after:tenant_detach"),
        ("b", "tenant_reattach:unpacked"),
        ("b", "after:tenant_reattach"),
    ],
)
def test_kill_inside_a_move_everywhere(shared: Path, killed: str, failpoint: str) -> None:
    _kill_inside_a_move(shared, killed, failpoint)


def _kill_inside_a_move(shared: Path, killed: str, failpoint: str) -> None:
    with running_nodes(2, PGPLANE_SHARED_DIR=str(shared), **ENV) as (a, b):
        _, key = a.create_key("crash-move@example.com")
        with Api(a, key) as api_a, Api(b, key) as api_b:
            cli(a, "nodes", "cordon", "node-b")
            body = api_a.create_ready_project(name="moving")
            cli(a, "nodes", "uncordon", "node-b")
            pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
            assert home((a, b), pid) is a
            fill(body["connection_uris"][0]["connection_uri"])
            wanted = contents(body["connection_uris"][0]["connection_uri"])

            victim = a if killed == "a" else b
            _restart(victim, failpoint)
            done = run_cli("nodes", "drain", "node-a", "--no-wait", data_dir=a.data_dir, env=a.env)
            assert done.returncode == 0, done.stderr
            needle = f"failpoint {failpoint} reached"
            wait_for(needle, lambda: needle in victim.log(), 120, server=victim)
            victim.stop(signal.SIGKILL)
            victim.env.pop("PGPLANE_FAILPOINTS")
            victim.start()

            def moved() -> bool:
                # Between the detach and the reattach neither node holds it: not yet.
                here = (b.data_dir / "projects" / pid).exists()
                ops = api_b.operations(pid)
                return here and all(o["status"] in ("finished", "failed") for o in ops)

            wait_for("the move settled", moved, 180, server=b)
            ops = api_b.operations(pid)
            assert all(o["status"] == "finished" for o in ops), ops
            assert [o["action"] for o in reversed(ops)][-4:] == [
                "suspend_compute",
                "tenant_detach",
                "tenant_reattach",
                "start_compute",
            ], ops
            assert api_b.endpoint(pid, eid)["current_state"] == "active"
            r = api_b.http.get(
                f"/projects/{pid}/connection_uri",
                params={"role_name": "neondb_owner", "database_name": "neondb"},
            )
            assert contents(r.json()["uri"]) == wanted
            with psycopg.connect(r.json()["uri"], connect_timeout=60) as conn:
                conn.execute("INSERT INTO t VALUES (0, 'after')")
            # Nothing left behind: the data on node-b alone, no archive anywhere.
            assert not (a.data_dir / "projects" / pid).exists()
            assert not (shared / "archive" / pid).exists()
            for server in (a, b):
                assert not (server.data_dir / "archive" / pid).exists()


@pytest.mark.slow
@pytest.mark.parametrize("failpoint", ["rebuild:replaying", "after:tenant_attach"])
def test_kill_inside_a_recovery(shared: Path, failpoint: str) -> None:
    """Node A lost for good, its project brought back on node B by `nodes recover`, and B
    SIGKILLed inside the rebuild (tenant_attach): once B is back, every operation of the
    recovery finished, each attempted on B once (the attach twice: the killed attempt and its
    retry), with every row A shipped before it died."""
    with running_nodes(2, PGPLANE_SHARED_DIR=str(shared), **ENV) as (a, b):
        pair = Pair(a, b, Storage("directory", shared))
        try:
            body = pair.project_on_a("lost")
            pid, branch_id = body["project"]["id"], body["branch"]["id"]
            fill(pair.uri(pid, pair.api_a), rows=2000)
            uri = pair.uri(pid)  # node-b's, before node-a dies
            with psycopg.connect(pair.uri(pid, pair.api_a), connect_timeout=60) as conn:
                row = conn.execute("SELECT pg_walfile_name(pg_current_wal_insert_lsn())")
                (segment,) = row.fetchone() or ("",)
            wanted = contents(pair.uri(pid, pair.api_a))
            wait_for(f"segment {segment} shipped",
                     lambda: segment in pair.storage.shipped(pid, branch_id), server=a)  # fmt: skip
            a.stop(signal.SIGKILL)  # for good
            _restart(b, failpoint)
            wait_down(b, "node-a")
            done = run_cli("nodes", "recover", "node-a", "--to", "node-b",
                           data_dir=b.data_dir, env=b.env)  # fmt: skip
            assert done.returncode == 0, done.stderr
            needle = f"failpoint {failpoint} reached"
            wait_for(needle, lambda: needle in b.log(), 180, server=b)
            b.stop(signal.SIGKILL)
            b.env.pop("PGPLANE_FAILPOINTS")
            before = Counter(attempts(b))
            b.start()

            recovery = [o for o in pair.api_b.operations(pid) if o["action"] == "tenant_attach"]
            assert len(recovery) == 1, recovery
            attach = recovery[0]
            after = [
                o["id"]
                for o in pair.api_b.operations(pid)
                if o["created_at"] >= attach["created_at"]
            ]
            ops = pair.api_b.wait_operations(pid, after, 180)
            assert {o["status"] for o in ops} == {"finished"}, (ops, b.log()[-4000:])
            assert sorted(o["action"] for o in ops) == ["start_compute", "tenant_attach"], ops
            ran = Counter(attempts(b))
            assert {op: ran[op] for op in after} == {
                op: 2 if op == attach["id"] else 1 for op in after
            }, (ran, before)
            assert not any(attach["id"] in line for line in a.log().splitlines()
                           if "attempt" in line)  # fmt: skip
            assert (b.data_dir / "projects" / pid).is_dir()  # A's copy: A is gone for good
            assert contents(uri) == wanted
        finally:
            pair.api_a.http.close()
            pair.api_b.http.close()
