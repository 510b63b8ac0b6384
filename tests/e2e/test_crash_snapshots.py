"""``pgplane serve`` killed inside a snapshot's creation, inside its restores and inside the
finalizing of a restore (the replaced branch's compute moved to the restored branch).

As the other crash suites (tests/crash.py): the server is SIGKILLed at a failpoint, restarted,
and every operation must finish exactly once: one snapshot, sealed, with the data of its point;
one restored branch (in its target's place when finalized, the target kept once), with the
snapshot's data; nothing half-built left beside them.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from tests.crash import ROWS, SUM, Crash, assert_consistent, slow

MORE = 10
AFTER = (ROWS + MORE, SUM + sum(range(ROWS + 1, ROWS + MORE + 1)))


def _more(crash: Crash) -> None:
    with psycopg.connect(crash.uri, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO t SELECT generate_series(%s::int, %s::int)", (ROWS + 1, ROWS + MORE)
        )


def _snapshots(crash: Crash) -> list[dict[str, Any]]:
    r = crash.api.http.get(f"/projects/{crash.pid}/snapshots")
    assert r.status_code == 200, r.text
    return list(r.json()["snapshots"])


def _snapshot_dirs(crash: Crash) -> list[str]:
    top = crash.server.data_dir / "projects" / crash.pid / "snapshots"
    return sorted(p.name for p in top.iterdir()) if top.is_dir() else []


def _uri(crash: Crash, branch_id: str) -> str:
    r = crash.api.http.post(
        f"/projects/{crash.pid}/endpoints",
        json={"endpoint": {"branch_id": branch_id, "type": "read_write"}},
    )
    endpoint = crash.api.settled(crash.pid, r)["endpoint"]
    r = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={
            "branch_id": branch_id,
            "endpoint_id": endpoint["id"],
            "database_name": "neondb",
            "role_name": "neondb_owner",
        },
    )
    return str(r.json()["uri"])


def _take(crash: Crash) -> dict[str, Any]:
    r = crash.api.http.post(f"/projects/{crash.pid}/branches/{crash.branch_id}/snapshot")
    return crash.api.settled(crash.pid, r)["snapshot"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("failpoint", ["create_snapshot:built", slow("after:create_snapshot")])
def test_kill_during_a_snapshots_creation(crash: Crash, failpoint: str) -> None:
    crash.arm(failpoint)
    r = crash.api.http.post(f"/projects/{crash.pid}/branches/{crash.branch_id}/snapshot")
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    (shown,) = _snapshots(crash)
    assert shown["id"] == r.json()["snapshot"]["id"] and shown["full_size"] > 0
    assert _snapshot_dirs(crash) == [shown["id"]]  # one copy, sealed, nothing beside it
    sealed = crash.server.data_dir / "projects" / crash.pid / "snapshots" / shown["id"]
    assert sorted(p.name for p in sealed.iterdir()) == ["pgdata", "sealed"]
    assert sealed.stat().st_mode & 0o777 == 0o700
    _more(crash)
    r = crash.api.http.post(f"/projects/{crash.pid}/snapshots/{shown['id']}/restore", json={})
    restored = crash.api.settled(crash.pid, r)["branch"]
    assert crash.rows(_uri(crash, restored["id"])) == (ROWS, SUM)
    crash.assert_adopted(crash.pgdata())  # the source's compute ran through it
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.parametrize("failpoint", ["restore_snapshot:copied", slow("after:create_branch")])
def test_kill_during_a_restore_into_a_new_branch(crash: Crash, failpoint: str) -> None:
    taken = _take(crash)
    _more(crash)
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/snapshots/{taken['id']}/restore", json={"name": "back"}
    )
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    branches = crash.api.http.get(f"/projects/{crash.pid}/branches").json()["branches"]
    assert sorted(b["name"] for b in branches) == sorted(["back", "main"])
    assert crash.rows(_uri(crash, r.json()["branch"]["id"])) == (ROWS, SUM)
    assert crash.rows() == AFTER
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.parametrize(
    "failpoint",
    ["restore_snapshot:copied", slow("after:create_branch"), slow("after:suspend_compute")],
)
def test_kill_during_a_finalized_restore(crash: Crash, failpoint: str) -> None:
    """With finalize_restore: the new branch built, the target's compute stopped on the old
    data and started on the new; killed anywhere, it ends serving the snapshot's data through
    the same connection string, the target kept whole under the name given."""
    taken = _take(crash)
    _more(crash)
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/snapshots/{taken['id']}/restore",
        json={"target_branch_id": crash.branch_id, "finalize_restore": True, "name": "old"},
    )
    assert r.status_code == 200, r.text
    restored = r.json()["branch"]
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.rows() == (ROWS, SUM)  # the same connection string, the snapshot's data
    assert crash.endpoint()["branch_id"] == restored["id"]
    branches = {
        b["name"]: b["id"]
        for b in crash.api.http.get(f"/projects/{crash.pid}/branches").json()["branches"]
    }
    assert branches == {"main": restored["id"], "old": crash.branch_id}
    assert crash.rows(_uri(crash, crash.branch_id)) == AFTER  # the state it replaced, whole
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.parametrize(
    "failpoint",
    [
        slow("stop_compute:signalled"),
        "start_compute:spawned",
        slow("after:suspend_compute"),
        slow("after:start_compute"),
    ],
)
def test_kill_while_a_restore_is_finalized(crash: Crash, failpoint: str) -> None:
    """The compute stopped on the old data, then started on the restored branch's: killed
    anywhere in between, it ends serving the snapshot's data through the same connection
    string, once, and nothing of it is left on the old data."""
    taken = _take(crash)
    _more(crash)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/snapshots/{taken['id']}/restore", json={"name": "candidate"}
    )
    restored = crash.api.settled(crash.pid, r)["branch"]
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches/{restored['id']}/finalize_restore", json={}
    )
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.rows() == (ROWS, SUM)  # the same connection string, the snapshot's data
    assert crash.endpoint()["branch_id"] == restored["id"]
    branches = {
        b["name"]: b["id"]
        for b in crash.api.http.get(f"/projects/{crash.pid}/branches").json()["branches"]
    }
    assert branches == {"main": restored["id"], "main (old)": crash.branch_id}
    assert crash.rows(_uri(crash, crash.branch_id)) == AFTER  # the state it replaced, whole
    assert_consistent(crash.server, crash.api, crash.pid)
