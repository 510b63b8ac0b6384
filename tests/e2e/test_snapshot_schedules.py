"""Backup schedules against a real server: the scheduler takes each due slot's snapshot once,
never twice (across ticks and restarts), and deletes the ones whose retention ran out.

A schedule only takes slots that come after it was set; so that a test need not wait for an
hour to strike, it moves the schedule's "set at" back in the store (as if set days ago), which
makes the latest slot due at the next tick.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.test_snapshots import listed, project_with_table
from tests.stores import store_sql
from tests.support import Api, Server, running_server, wait_for

_DAY_US = 86_400 * 1_000_000


@pytest.fixture
def server() -> Iterator[Server]:
    with running_server(PGPLANE_SCHEDULER_SECONDS="0.2") as srv:
        yield srv


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key(f"schedules-{time.monotonic_ns()}")
    with Api(server, key) as client:
        yield client


def _store(server: Server, sql: str, *params: object) -> None:
    """A change made in the server's store, as if time had passed (see the module's note)."""
    store_sql(server).execute(sql, params)


def _scheduled(api: Api, pid: str) -> list[dict[str, Any]]:
    return [s for s in listed(api, pid) if not s["manual"]]


def test_a_schedule_takes_each_slot_once_and_drops_expired_ones(api: Api, server: Server) -> None:
    project, pid, _ = project_with_table(api, "scheduled")
    main = project["branch"]["id"]
    where = f"/projects/{pid}/branches/{main}/backup_schedule"
    assert api.http.get(where).json() == {"schedule": []}
    hour = datetime.datetime.now(datetime.UTC).hour
    entry = {"frequency": "daily", "hour": hour, "retention_seconds": 7200}
    r = api.http.put(where, json={"schedule": [entry]})
    assert r.status_code == 200, r.text
    assert api.http.get(where).json() == {"schedule": [entry]}
    assert _scheduled(api, pid) == []  # today's slot came before the schedule was set

    _store(server, "UPDATE backup_schedules SET updated_at = updated_at - ?", 2 * _DAY_US)
    (taken,) = wait_for("the due slot's snapshot", lambda: _scheduled(api, pid), server=server)
    assert taken["expires_at"] is not None and taken["source_branch_id"] == main
    ops = [o for o in api.operations(pid) if o["action"] == "create_timeline"]  # Neon's name
    api.wait_operations(pid, [o["id"] for o in ops])

    # Across a restart, with the slot still due, it is not taken again. A second branch's
    # schedule, made due after the restart, shows the scheduler has looked since.
    server.stop()
    server.start()
    r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "other"}})
    other = api.settled(pid, r)["branch"]["id"]
    r = api.http.put(
        f"/projects/{pid}/branches/{other}/backup_schedule", json={"schedule": [entry]}
    )
    assert r.status_code == 200, r.text
    _store(
        server,
        "UPDATE backup_schedules SET updated_at = updated_at - ? WHERE branch_id = ?",
        2 * _DAY_US,
        other,
    )
    wait_for(
        "the other branch's snapshot",
        lambda: any(s["source_branch_id"] == other for s in _scheduled(api, pid)),
        server=server,
    )
    assert [s["id"] for s in _scheduled(api, pid) if s["source_branch_id"] == main] == [taken["id"]]

    # Its retention over: deleted by the scheduler, with an operation, and not taken again.
    _store(server, "UPDATE snapshots SET expires_at = 1 WHERE id = ?", taken["id"])
    wait_for(
        "the expired snapshot to go",
        lambda: taken["id"] not in {s["id"] for s in listed(api, pid)},
        server=server,
    )
    deletes = [o for o in api.operations(pid) if o["action"] == "delete_timeline"]
    assert len(deletes) == 1
    api.wait_operations(pid, [deletes[0]["id"]])
    snapshot_dir = server.data_dir / "projects" / pid / "snapshots" / taken["id"]
    wait_for("its data to be freed", lambda: not snapshot_dir.exists(), server=server)
    assert taken["id"] not in {s["id"] for s in _scheduled(api, pid)}
    assert all(s["source_branch_id"] != main for s in _scheduled(api, pid))


def test_bad_schedules_are_a_400_naming_the_field(api: Api) -> None:
    project, pid, _ = project_with_table(api, "bad-schedule")
    where = f"/projects/{pid}/branches/{project['branch']['id']}/backup_schedule"
    for item, field in [
        ({"frequency": "hourly"}, "frequency"),
        ({"frequency": "daily", "hour": 24}, "hour"),
        ({"frequency": "daily", "retention_seconds": 3_024_001}, "retention_seconds"),
        ({"frequency": "daily", "retention_seconds": 60}, "retention_seconds"),
        ({"frequency": "daily", "day": 3}, "day"),
        ({"frequency": "weekly", "day": 9}, "day"),
        ({"frequency": "monthly", "day": 32}, "day"),
        ({"frequency": "monthly", "day": 1, "month": 2}, "month"),
    ]:
        r = api.http.put(where, json={"schedule": [item]})
        assert r.status_code == 400, (item, r.text)
        assert field in r.json()["message"], (item, r.text)
    assert api.http.get(where).json() == {"schedule": []}
