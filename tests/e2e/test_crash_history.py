"""``pgplane serve`` killed in the middle of a point-in-time branch and of a restore.

As the other crash suites (tests/crash.py): the server is SIGKILLed at a failpoint, restarted,
and every operation must finish, with the data it promised and nothing half-built: a branch at a
point of its parent's history (the parent's data never touched, its compute running through), a
branch restored from its own past with its old state preserved, or reset to its parent.
"""

from __future__ import annotations

import datetime
import time

import psycopg
import pytest

from pgplane.compute.local.tenants.cgroups import REPLAY_WORK
from tests.crash import ROWS, SUM, Crash, assert_consistent, slow

MORE = 10  # rows committed after the point
AFTER = (ROWS + MORE, SUM + sum(range(ROWS + 1, ROWS + MORE + 1)))


def _point_then_more(crash: Crash) -> str:
    """A moment after the fixture's rows, then ``MORE`` rows committed after it."""
    with psycopg.connect(crash.uri, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        time.sleep(0.05)
        conn.execute(
            "INSERT INTO t SELECT generate_series(%s::int, %s::int)", (ROWS + 1, ROWS + MORE)
        )
    moment: datetime.datetime = row[0]
    return moment.astimezone(datetime.UTC).isoformat()


@pytest.mark.parametrize("failpoint", ["rebuild:replaying", slow("after:create_branch")])
def test_kill_during_a_point_in_time_branch(crash: Crash, failpoint: str) -> None:
    point = _point_then_more(crash)
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={
            "branch": {"name": "then", "parent_timestamp": point},
            "endpoints": [{"type": "read_write"}],
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    crash.kill_at(failpoint)
    if failpoint == "rebuild:replaying":  # the tenant's WAL replayed in a cgroup of its own
        replaying = crash.pgdata(body["branch"]["id"]).with_name("pgdata.tmp")
        crash.assert_capped_at_kill(replaying, cpus=REPLAY_WORK.cpus)
    crash.settle([o["id"] for o in body["operations"]])
    assert crash.rows(body["connection_uris"][0]["connection_uri"]) == (ROWS, SUM)
    crash.assert_adopted(crash.pgdata())  # the parent ran through it, untouched
    assert crash.rows() == AFTER
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.parametrize(
    "failpoint",
    [
        slow("restore_branch:built"),
        "restore_branch:moved",
        slow("rebuild:replaying"),
        slow("after:create_timeline"),
    ],
)
def test_kill_during_a_restore_from_the_branchs_own_past(crash: Crash, failpoint: str) -> None:
    point = _point_then_more(crash)
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches/{crash.branch_id}/restore",
        json={
            "source_branch_id": crash.branch_id,
            "source_timestamp": point,
            "preserve_under_name": "before",
        },
    )
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    if failpoint == "rebuild:replaying":
        replaying = crash.pgdata().with_name("pgdata.restored.tmp")
        crash.assert_capped_at_kill(replaying, cpus=REPLAY_WORK.cpus)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.rows() == (ROWS, SUM)  # the same connection string, the restored data
    branch = crash.api.http.get(f"/projects/{crash.pid}/branches/{crash.branch_id}").json()
    kept = branch["branch"]["parent_id"]
    assert kept is not None
    assert crash.checksums(kept)  # the preserved branch's files readable (no compute runs it)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/endpoints",
        json={"endpoint": {"branch_id": kept, "type": "read_write"}},
    )
    endpoint = crash.api.settled(crash.pid, r)["endpoint"]
    r = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={
            "branch_id": kept,
            "endpoint_id": endpoint["id"],
            "database_name": "neondb",
            "role_name": "neondb_owner",
        },
    )
    assert crash.rows(r.json()["uri"]) == AFTER  # the state before the restore, whole
    assert_consistent(crash.server, crash.api, crash.pid)


@pytest.mark.slow
def test_kill_during_a_reset_to_the_parent(crash: Crash) -> None:
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={"branch": {"name": "preview"}, "endpoints": [{"type": "read_write"}]},
    )
    child = crash.api.settled(crash.pid, r)
    child_uri = child["connection_uris"][0]["connection_uri"]
    with psycopg.connect(child_uri, autocommit=True) as conn:
        conn.execute("DELETE FROM t")
    crash.arm("restore_branch:moved")
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches/{child['branch']['id']}/restore",
        json={"source_branch_id": crash.branch_id},
    )
    assert r.status_code == 200, r.text
    crash.kill_at("restore_branch:moved")
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.rows(child_uri) == (ROWS, SUM)
    assert_consistent(crash.server, crash.api, crash.pid)
