"""``pgplane serve`` killed inside and just after each kind of operation loses nothing.

SIGKILL gives the process no chance to clean up: the operation it was running stays ``running``
with a lease nobody renews, and whatever it had done on disk or to a postmaster stays done. The
restarted server must take the operation over, finish it, and leave the platform as if nothing
had happened: every operation ``finished``, exactly one copy of each object, one postmaster per
running compute and none for the others, a compute that ran through the kill still served by
the same postmaster (adopted, not started again), every committed row in place.

The kill lands at a failpoint named after the step (see tests/crash.py): inside a handler
(``project_volume:mounted``: a new project's filesystem mounted, its directory not yet
given to its user, ``create_timeline:populated``: the cluster being built is running,
``start_compute:spawned``: a postmaster exists but is not ready, ``stop_compute:signalled``:
told to stop, maybe not gone, ``apply_config:executed``: between two statements of a change)
and ``after:<action>``, the hardest case: the work is done, the store does not know it.
Branches, deletes, detach and reattach, and writes through the proxy are in test_crash_data.py.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.crash import ENV as CRASH_ENV
from tests.crash import (
    ROWS,
    SUM,
    Crash,
    assert_consistent,
    kill_at,
    operations,
    postmaster_pids,
    slow,
    wait_for_op,
)
from tests.support import Api, running_server


@pytest.mark.parametrize(
    "failpoint",
    [
        "project_volume:mounted",
        slow("create_timeline:copied"),
        "create_timeline:populated",
        slow("create_timeline:synced"),
        slow("after:create_timeline"),
        "start_compute:spawned",
        slow("after:start_compute"),
    ],
)
def test_kill_during_project_creation(failpoint: str) -> None:
    with running_server(**CRASH_ENV, PGPLANE_FAILPOINTS=failpoint) as server:
        _, key = server.create_key("crash@example.com")
        with Api(server, key) as api:
            body = api.create_project(name="interrupted")
            pid = body["project"]["id"]
            kill_at(server, failpoint)
            pgdata = server.data_dir / "projects" / pid / "branches" / body["branch"]["id"]
            spawned = postmaster_pids(server.data_dir / "projects" / pid).get(pgdata / "pgdata")
            server.env.pop("PGPLANE_FAILPOINTS")
            server.start()
            ops = api.wait_operations(pid, [o["id"] for o in body["operations"]])
            assert [o["status"] for o in ops] == ["finished", "finished"], (ops, server.log())
            assert len(operations(api, pid)) == 2  # nothing duplicated, no second start
            if failpoint.endswith("start_compute"):  # the compute ran through the kill
                assert spawned is not None
                assert (
                    postmaster_pids(server.data_dir / "projects" / pid)[pgdata / "pgdata"]
                    == spawned
                )
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=10) as conn:
                assert conn.execute("select current_database()").fetchone() == ("neondb",)
            assert_consistent(server, api, pid)


@pytest.mark.both_stores
@pytest.mark.parametrize("failpoint", ["start_compute:spawned", slow("after:start_compute")])
def test_kill_while_a_compute_starts(crash: Crash, failpoint: str) -> None:
    crash.suspend()
    starts = crash.starts()
    crash.arm(failpoint)
    r = crash.api.http.post(f"/projects/{crash.pid}/endpoints/{crash.eid}/start")
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)  # a postmaster runs (ready or not); the store says it is starting
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.endpoint()["current_state"] == "active"
    crash.assert_adopted(crash.pgdata())
    assert crash.starts() == starts + 1
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)
    crash.assert_adopted(crash.pgdata())  # served by the same postmaster


@pytest.mark.parametrize(
    "failpoint",
    [slow("suspend_compute:roles_read"), "stop_compute:signalled", slow("after:suspend_compute")],
)
def test_kill_while_a_compute_suspends(crash: Crash, failpoint: str) -> None:
    starts = crash.starts()
    crash.arm(failpoint)
    r = crash.api.http.post(f"/projects/{crash.pid}/endpoints/{crash.eid}/suspend")
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.endpoint()["current_state"] == "idle"
    assert_consistent(crash.server, crash.api, crash.pid)  # and no postmaster
    assert crash.starts() == starts  # the retry suspended it; it did not start it again
    assert crash.rows() == (ROWS, SUM)  # woken by the connection


def test_kill_while_new_settings_restart_a_compute(crash: Crash) -> None:
    """The old postmaster was told to stop; the retry starts one with the new settings."""
    crash.arm("restart_compute:signalled")
    r = crash.api.http.patch(
        f"/projects/{crash.pid}/endpoints/{crash.eid}",
        json={"endpoint": {"settings": {"pg_settings": {"work_mem": "8MB"}}}},
    )
    assert r.status_code == 200, r.text
    crash.kill_at("restart_compute:signalled")
    crash.settle([o["id"] for o in r.json()["operations"]])
    assert crash.endpoint()["current_state"] == "active"
    assert_consistent(crash.server, crash.api, crash.pid)
    with psycopg.connect(crash.uri, connect_timeout=30) as conn:
        assert conn.execute("SHOW work_mem").fetchone() == ("8MB",)
    assert crash.rows() == (ROWS, SUM)


def test_kill_while_a_suspended_compute_is_checked(crash: Crash) -> None:
    """An availability check of a suspended compute runs a temporary postmaster on its data:
    killed meanwhile, it is left running; the retry, and the next start, stop it first."""
    crash.suspend()
    crash.arm("offline_postmaster:ready", PGPLANE_AVAILABILITY_CHECK_SECONDS="1")
    crash.kill_at("offline_postmaster:ready")
    assert crash.pgdata() in crash.at_kill  # the temporary postmaster
    check = wait_for_op(crash.api, crash.pid, "check_availability")
    crash.settle([check["id"]])
    assert crash.endpoint()["current_state"] == "idle"
    assert_consistent(crash.server, crash.api, crash.pid)  # and no postmaster left
    assert crash.rows() == (ROWS, SUM)


@pytest.mark.both_stores
@pytest.mark.parametrize("failpoint", ["apply_config:executed", slow("after:apply_config")])
def test_kill_while_a_role_and_a_password_reset_are_applied(crash: Crash, failpoint: str) -> None:
    """``apply_config:executed`` is reached after the first statement of the change (the
    owner's ALTER ROLE), before the next (CREATE ROLE app)."""
    roles = f"/projects/{crash.pid}/branches/{crash.branch_id}/roles"
    crash.arm(failpoint)
    r = crash.api.http.post(roles, json={"role": {"name": "app"}})
    assert r.status_code == 201, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    crash.assert_adopted(crash.pgdata())  # a role change restarts nothing
    listed = crash.api.http.get(roles).json()["roles"]
    assert [x["name"] for x in listed].count("app") == 1
    with psycopg.connect(crash.uri) as conn:
        found = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'app'").fetchone()
        assert found == (1,)

    old = crash.uri
    crash.arm(failpoint)
    r = crash.api.http.post(f"{roles}/neondb_owner/reset_password")
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in r.json()["operations"]])
    crash.assert_adopted(crash.pgdata())
    new = crash.api.http.get(
        f"/projects/{crash.pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner"},
    ).json()["uri"]
    assert new != old
    assert crash.rows(new) == (ROWS, SUM)
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(old, connect_timeout=10).close()
    assert_consistent(crash.server, crash.api, crash.pid)
