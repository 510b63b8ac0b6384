"""A node drained, and the node it leaves or the node it goes to SIGKILLed inside the move: after
the killed node restarts, every operation of the move finished, the project is on the other node
once, whole (every row), its compute running again, and nothing of it is left behind (no data on
the node it left, no archive on shared storage or on either node)."""

from __future__ import annotations

import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.e2e.test_nodes_move import ENV, contents, fill
from tests.nodes import cli, home, running_nodes
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


# CI kills at one point on each side; -m slow at the others too.
@pytest.mark.parametrize(
    ("killed", "failpoint"), [("a", "tenant_detach:stored"), ("b", "tenant_reattach:fetched")]
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
