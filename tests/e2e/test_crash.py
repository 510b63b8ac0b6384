"""A ``pgplane serve`` killed mid-operation loses nothing: after a restart every operation settles.

SIGKILL gives the process no chance to clean up: the operation it was running stays ``running``
with a lease that no one renews. The restarted server must take it over once the lease expires,
finish it, and leave exactly one working copy of what it was building.
"""

from __future__ import annotations

import signal
import time

import psycopg
import pytest

from tests.support import Api, running_server


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.2])
def test_sigkill_during_project_creation(delay: float) -> None:
    with running_server(PGPLANE_LEASE_SECONDS="1", PGPLANE_HEARTBEAT_SECONDS="0.3") as server:
        _, key = server.create_key("crash@example.com")
        with Api(server, key) as api:
            body = api.create_project(name="interrupted")
            time.sleep(delay)
            server.stop(signal.SIGKILL)
            server.start()
            pid = body["project"]["id"]
            ops = api.wait_operations(pid, [o["id"] for o in body["operations"]])
            assert [o["status"] for o in ops] == ["finished", "finished"], (
                ops,
                server.log()[-3000:],
            )
            listed = api.http.get(f"/projects/{pid}/operations").json()["operations"]
            assert len(listed) == 2  # nothing duplicated
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=10) as conn:
                assert conn.execute("select current_database()").fetchone() == ("neondb",)
            branches = list((server.data_dir / "projects" / pid / "branches").iterdir())
            assert [b.name for b in branches] == [body["branch"]["id"]]
