"""``pgplane serve`` killed while it starts a read-only compute: the start converges, once.

The kill lands inside the standby's start: its copy of the branch whole but no postmaster yet
(``start_replica:copied``), inside the online copy of the running primary
(``create_branch:backup_started``: the primary's backup session ends with the killed process),
and with the standby's postmaster spawned but not yet ready (``start_compute:spawned``). After
the restart the one ``start_compute`` finishes, the replica serves the branch's rows, nothing
half-copied is left, and the primary ran through it all untouched. And killed while a replica
is suspended (told to stop, its data still there): the suspend finishes, its data goes.
"""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from tests.crash import ROWS, SUM, Crash, assert_consistent, slow


@pytest.mark.parametrize(
    "failpoint",
    ["start_replica:copied", slow("create_branch:backup_started"), slow("start_compute:spawned")],
)
def test_kill_while_a_replica_starts(crash: Crash, failpoint: str) -> None:
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/endpoints",
        json={"endpoint": {"branch_id": crash.branch_id, "type": "read_only"}},
    )
    assert r.status_code == 201, r.text
    replica = r.json()["endpoint"]["id"]
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])

    starts = [
        o for o in crash.ops() if o["action"] == "start_compute" and o["endpoint_id"] == replica
    ]
    assert len(starts) == 1, starts
    assert crash.api.endpoint(crash.pid, replica)["current_state"] == "active"
    uri = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner", "endpoint_id": replica},
    ).json()["uri"]
    assert crash.rows(uri) == (ROWS, SUM)
    crash.assert_adopted(crash.pgdata())
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)
    with psycopg.connect(uri) as conn, pytest.raises(errors.ReadOnlySqlTransaction):
        conn.execute("DELETE FROM t")


def test_kill_while_a_replica_is_suspended(crash: Crash) -> None:
    """Killed with the standby told to stop (``stop_compute:signalled``), its data not yet
    removed: the retried suspend finishes it, and a connection wakes the replica afresh."""
    r = crash.api.http.post(
        f"/projects/{crash.pid}/endpoints",
        json={"endpoint": {"branch_id": crash.branch_id, "type": "read_only"}},
    )
    assert r.status_code == 201, r.text
    replica = r.json()["endpoint"]["id"]
    crash.settle([o["id"] for o in r.json()["operations"]])
    crash.arm("stop_compute:signalled")
    r = crash.api.http.post(f"/projects/{crash.pid}/endpoints/{replica}/suspend")
    assert r.status_code == 200, r.text
    crash.kill_at("stop_compute:signalled")
    crash.settle([o["id"] for o in r.json()["operations"]])

    assert crash.api.endpoint(crash.pid, replica)["current_state"] == "idle"
    assert not crash.pgdata().parent.joinpath("replicas", replica).exists()
    crash.assert_adopted(crash.pgdata())
    assert_consistent(crash.server, crash.api, crash.pid)
    uri = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner", "endpoint_id": replica},
    ).json()["uri"]
    assert crash.rows(uri) == (ROWS, SUM)
