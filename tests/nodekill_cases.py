"""The kill cases of the multi-node suites: one kind of operation each, started on a project of
node C's through another node's API (tests/nodekill.py kills C inside it). Each says which
action the killed operation is, and may prepare C before its failpoint is armed and arm C with
settings of its own (a scheduler's job made due at once)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from pgplane.core.operations import Action
from tests.crash import postmaster_pids, wait_for_op
from tests.nodes import create_on
from tests.support import wait_for
from tests.trio import ROWS, SUM, Started, Trio, branch_pgdata, rows, start_count


@dataclass(frozen=True)
class Case:
    action: Action  # the operation the kill interrupts
    start: Callable[[Trio], Started]
    prepare: Callable[[Trio], None] = lambda _: None  # before C is armed
    env: dict[str, str] = field(default_factory=dict)  # C's, while armed


def _branch(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    parent = branch_pgdata(trio, pid, trio.main_branch(pid))
    api = trio.api(trio.b)
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": trio.name("copied")}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    branch_id = r.json()["branch"]["id"]

    def check(at_kill: dict[Path, int]) -> None:
        # The copy was put in place once: one "branched" line for it in all three logs.
        placed = sum(s.log().count(f"/branches/{branch_id}/pgdata from") for s in trio.servers)
        assert placed == 1, placed
        assert postmaster_pids(parent.parents[2])[parent] == at_kill[parent]  # parent untouched
        assert rows(trio.uri(pid, branch_id=branch_id)) == (ROWS, SUM)
        assert rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _start(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    api.suspend(pid, eid)
    starts = start_count(api, pid)
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/start")
    assert r.status_code == 200, r.text
    pgdata = branch_pgdata(trio, pid, trio.main_branch(pid))

    def check(at_kill: dict[Path, int]) -> None:
        assert api.endpoint(pid, eid)["current_state"] == "active"
        # The postmaster spawned before the kill serves: started once, adopted after.
        assert postmaster_pids(pgdata.parents[2])[pgdata] == at_kill[pgdata]
        assert start_count(api, pid) == starts + 1
        assert rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _suspend(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    starts = start_count(api, pid)
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert api.endpoint(pid, eid)["current_state"] == "idle"
        assert start_count(api, pid) == starts  # suspended by the retry, not started again
        assert postmaster_pids(trio.c.data_dir / "projects" / pid) == {}

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _role(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api, name = trio.api(trio.b), trio.name("app").replace("-", "_")
    roles = f"/projects/{pid}/branches/{trio.main_branch(pid)}/roles"
    r = api.http.post(roles, json={"role": {"name": name}})
    assert r.status_code == 201, r.text

    def check(_: dict[Path, int]) -> None:
        listed = [x["name"] for x in api.http.get(roles).json()["roles"]]
        assert listed.count(name) == 1
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            found = conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", [name])
            assert found.fetchone() == (1,)
        with psycopg.connect(trio.uri(pid, role=name), connect_timeout=60) as conn:
            assert conn.execute("SELECT current_user").fetchone() == (name,)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _settings(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api, eid = trio.api(trio.a), trio.endpoint(pid)
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{eid}",
        json={"endpoint": {"settings": {"pg_settings": {"work_mem": "12MB"}}}},
    )
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            assert conn.execute("SHOW work_mem").fetchone() == ("12MB",)
        assert rows(trio.uri(pid)) == (ROWS, SUM)

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _project(trio: Trio) -> Started:
    body = create_on(trio.c, trio.servers, trio.api(trio.a), trio.name("born"))
    pid = body["project"]["id"]
    trio.projects[pid], trio.homes[pid] = body, trio.c

    def check(_: dict[Path, int]) -> None:
        api = trio.api(trio.b)
        assert [o["action"] for o in api.operations(pid)].count("start_compute") == 1
        with psycopg.connect(trio.uri(pid), connect_timeout=60) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("neondb",)

    return Started(pid, [o["id"] for o in body["operations"]], check)


def _delete_branch(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api = trio.api(trio.b)
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": trio.name("doomed")}, "endpoints": [{"type": "read_write"}]},
    )
    branch_id = api.settled(pid, r)["branch"]["id"]
    r = api.http.delete(f"/projects/{pid}/branches/{branch_id}")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert not branch_pgdata(trio, pid, branch_id).parent.exists()
        listed = [b["id"] for b in api.http.get(f"/projects/{pid}/branches").json()["branches"]]
        assert branch_id not in listed

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _delete_project(trio: Trio) -> Started:
    api = trio.api(trio.a)
    body = create_on(trio.c, trio.servers, api, trio.name("short"))
    pid = body["project"]["id"]
    api.wait_operations(pid, [o["id"] for o in body["operations"]], 120)
    r = api.http.delete(f"/projects/{pid}")
    assert r.status_code == 200, r.text

    def check(_: dict[Path, int]) -> None:
        assert api.http.get(f"/projects/{pid}").status_code == 404
        assert all(pid not in {p["id"] for p in x.http.get("/projects").json()["projects"]}
                   for x in trio.apis)  # fmt: skip

    return Started(pid, [o["id"] for o in r.json()["operations"]], check, gone=True)


def _snapshot(trio: Trio) -> Started:
    pid = trio.on(trio.c)[0]
    api = trio.api(trio.b)
    r = api.http.post(f"/projects/{pid}/branches/{trio.main_branch(pid)}/snapshot")
    assert r.status_code in (200, 201), r.text
    snapshot_id = r.json()["snapshot"]["id"]

    def check(_: dict[Path, int]) -> None:
        listed = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
        assert [s["id"] for s in listed].count(snapshot_id) == 1

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _history_window(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api, seconds = trio.api(trio.b), 3600 + next(trio.names)
    r = api.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": seconds}})
    assert r.status_code == 200, r.text
    ops = r.json()["operations"]
    assert "apply_storage_config" in [o["action"] for o in ops], ops

    def check(_: dict[Path, int]) -> None:
        project = api.http.get(f"/projects/{pid}").json()["project"]
        assert project["history_retention_seconds"] == seconds
        config = trio.c.data_dir / "projects" / pid / "storage.json"
        assert f'"history_retention_seconds": {seconds}' in config.read_text()

    return Started(pid, [o["id"] for o in ops], check)


def _delete_snapshot(trio: Trio) -> Started:
    pid = trio.on(trio.c)[1]
    api = trio.api(trio.a)
    made = api.settled(
        pid, api.http.post(f"/projects/{pid}/branches/{trio.main_branch(pid)}/snapshot")
    )
    snapshot_id = made["snapshot"]["id"]
    sealed = trio.c.data_dir / "projects" / pid / "snapshots" / snapshot_id
    assert sealed.is_dir()
    r = api.http.delete(f"/projects/{pid}/snapshots/{snapshot_id}")
    assert r.status_code in (200, 202), r.text

    def check(_: dict[Path, int]) -> None:
        listed = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
        assert snapshot_id not in [s["id"] for s in listed]
        assert not sealed.exists()

    return Started(pid, [o["id"] for o in r.json()["operations"]], check)


def _held(trio: Trio, pid: str, action: str) -> str:
    """The id of the project's ``action`` operation once one runs (a scheduler's job)."""
    api = trio.api(trio.a)

    def running() -> str | None:
        ops = api.operations(pid)
        return next(
            (o["id"] for o in ops if (o["action"], o["status"]) == (action, "running")), None
        )

    found: str = wait_for(f"a {action} operation running", running, 120, server=trio.c)
    return found


def _suspended_fresh(trio: Trio, prefix: str) -> tuple[str, str]:
    pid = trio.fresh_on_c(prefix)
    eid = trio.endpoint(pid)
    trio.api(trio.a).suspend(pid, eid)
    return pid, eid


def _availability_check(trio: Trio) -> Started:
    """C checks every branch with a compute each second while armed: the new project's, once
    suspended, on a temporary postmaster (the failpoint), the others' on their running
    computes (wake_c before arming)."""
    pid, eid = _suspended_fresh(trio, "checked")
    api = trio.api(trio.a)
    check_op = _held(trio, pid, "check_availability")

    def check(at_kill: dict[Path, int]) -> None:
        main = branch_pgdata(trio, pid, trio.main_branch(pid))
        assert main in at_kill  # the temporary postmaster the kill left
        assert api.endpoint(pid, eid)["current_state"] == "idle"  # checked, not woken
        assert postmaster_pids(trio.c.data_dir / "projects" / pid) == {}  # stopped by the retry

    return Started(pid, [check_op], check)


def _detach(trio: Trio) -> Started:
    """The new project, suspended, is the only idle one on C (wake_c before arming): the
    detach C's scheduler starts at once is its."""
    pid, _ = _suspended_fresh(trio, "resting")
    detach = _held(trio, pid, "tenant_detach")
    trio.detached.add(pid)
    return Started(pid, [detach], detached=True)


def _detached_on_c(trio: Trio) -> None:
    """A project of C's resting in its archive: made so (C restarted with detaching at once,
    every other project of it busy) when none is."""
    if trio.detached:
        return
    c = trio.c
    c.stop()
    c.env["PGPLANE_DETACH_AFTER_SECONDS"] = "1"
    c.start()
    try:
        trio.wake_c()
        pid, _ = _suspended_fresh(trio, "archived")
        detach = wait_for_op(trio.api(trio.a), pid, "tenant_detach", 120)
        done = trio.api(trio.a).wait_operations(pid, [detach["id"]], 120)
        assert [o["status"] for o in done] == ["finished"], done
        trio.detached.add(pid)
    finally:
        c.stop()
        c.env.pop("PGPLANE_DETACH_AFTER_SECONDS")
        c.start()


def _reattach(trio: Trio) -> Started:
    pid = sorted(trio.detached)[0]
    api = trio.api(trio.b)
    r = api.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 7200}})
    assert r.status_code == 200, r.text
    ops = r.json()["operations"]
    assert ops[0]["action"] == "tenant_reattach", ops
    trio.detached.discard(pid)

    def check(_: dict[Path, int]) -> None:
        assert not (trio.c.data_dir / "archive" / pid).exists()
        assert rows(trio.uri(pid)) == (ROWS, SUM)  # wakes it: checked after the counts

    return Started(pid, [o["id"] for o in ops], check)


CASES: dict[str, Case] = {
    "create_branch:copied": Case(Action.CREATE_BRANCH, _branch),
    "start_compute:spawned": Case(Action.START_COMPUTE, _start),
    "stop_compute:signalled": Case(Action.SUSPEND_COMPUTE, _suspend),
    "apply_config:executed": Case(Action.APPLY_CONFIG, _role),
    "restart_compute:signalled": Case(Action.APPLY_CONFIG, _settings),
    "create_timeline:populated": Case(Action.CREATE_TIMELINE, _project),
    "delete_timeline:stopped": Case(Action.DELETE_TIMELINE, _delete_branch),
    "delete_tenant:stopped": Case(Action.DELETE_TENANT, _delete_project),
    "create_snapshot:built": Case(Action.CREATE_SNAPSHOT, _snapshot),
    "after:apply_storage_config": Case(Action.APPLY_STORAGE_CONFIG, _history_window),
    "after:delete_snapshot": Case(Action.DELETE_SNAPSHOT, _delete_snapshot),
    "offline_postmaster:ready": Case(
        Action.CHECK_AVAILABILITY,
        _availability_check,
        prepare=lambda trio: trio.wake_c(),
        env={"PGPLANE_AVAILABILITY_CHECK_SECONDS": "1"},
    ),
    "tenant_detach:packed": Case(
        Action.TENANT_DETACH,
        _detach,
        prepare=lambda trio: trio.wake_c(),
        env={"PGPLANE_DETACH_AFTER_SECONDS": "2"},
    ),
    "tenant_reattach:unpacked": Case(Action.TENANT_REATTACH, _reattach, prepare=_detached_on_c),
    # The work done, the store not told: the retry must find it done and not do it again.
    "after:create_branch": Case(Action.CREATE_BRANCH, _branch),
    "after:start_compute": Case(Action.START_COMPUTE, _start),
}

# The one kind a node of the trio never runs: a project rebuilt from shared storage after its
# node was lost for good (the operator's recover). Its kill is the two-node suite's. And an
# anonymized branch's masking, killed inside on one node by the crash suite (it runs on the
# project's node like any branch's work).
ELSEWHERE = {
    Action.TENANT_ATTACH: ("tests.e2e.test_crash_move", "test_kill_inside_a_recovery"),
    Action.ANONYMIZE: ("tests.e2e.test_crash_anonymized", "test_kill_inside_a_masking"),
}
