"""Neon's own Python SDK (``neon-api``) parses every response with its models."""

from __future__ import annotations

import time

import pytest
from neon_api import NeonAPI
from neon_api.exceptions import NeonAPIError

from tests.support import Api, Server


@pytest.fixture
def neon(server: Server, api: Api) -> NeonAPI:
    return NeonAPI(api.key, base_url=server.base_url + "/")


def _wait(neon: NeonAPI, project_id: str, op_ids: list[str]) -> None:
    deadline = time.monotonic() + 60
    while True:
        statuses = [neon.operation(project_id, op).operation.status.value for op in op_ids]
        if all(s in ("finished", "failed") for s in statuses):
            assert set(statuses) == {"finished"}, statuses
            return
        assert time.monotonic() < deadline, statuses
        time.sleep(0.05)


def test_sdk_parses_api_key_responses(neon: NeonAPI) -> None:
    created = neon.api_key_create(key_name="sdk")
    assert created.name == "sdk"
    listed = neon.api_keys()
    assert created.id in [k.id for k in listed]
    revoked = neon.api_key_revoke(created.id)
    assert revoked.revoked is True


def test_sdk_parses_project_and_operation_responses(neon: NeonAPI, server: Server) -> None:
    created = neon.project_create(project={"name": "sdk-project"})
    project = created.project
    assert project.name == "sdk-project"
    raw = Api(server, neon._api_key)  # the SDK drops fields it does not model; read the ops raw
    with raw:
        ops = raw.http.get(f"/projects/{project.id}/operations").json()["operations"]
    _wait(neon, project.id, [o["id"] for o in ops])

    assert neon.project(project.id).project.id == project.id
    assert project.id in [p.id for p in neon.projects().projects]
    page = neon.operations(project.id, limit=1)
    assert len(page.operations) == 1
    op = neon.operation(project.id, page.operations[0].id).operation
    assert op.status.value == "finished"
    assert op.total_duration_ms >= 0

    # Once the project has a snapshot (taken and deleted), its operations still parse: their
    # actions are in Neon's enum.
    with Api(server, neon._api_key) as again:
        r = again.http.post(f"/projects/{project.id}/branches/{ops[0]['branch_id']}/snapshot")
        taken = again.settled(project.id, r)["snapshot"]
        gone = again.http.delete(f"/projects/{project.id}/snapshots/{taken['id']}")
        assert gone.status_code == 202, gone.text
        again.wait_operations(project.id, [o["id"] for o in gone.json()["operations"]])
    actions = [o.action.value for o in neon.operations(project.id).operations]
    assert actions.count("create_timeline") == 2 and "delete_timeline" in actions, actions

    updated = neon.project_update(
        project.id, project={"name": "renamed", "history_retention_seconds": 60}
    )
    assert updated.project.name == "renamed"
    deleted = neon.project_delete(project.id)
    assert deleted.project.id == project.id


def test_sdk_enum_lacks_delete_tenant(neon: NeonAPI, api: Api) -> None:
    """A known limit of the SDK, pinned so we notice if either side changes.

    The contract names "Delete tenant" as an operation kind (``delete_tenant``, DESIGN §5), but
    the SDK's action enum has no such value: Neon never lists a deleted project's operations. The
    SDK parses everything else; a client polling a deletion reads it raw.
    """
    from pydantic import ValidationError

    body = api.create_ready_project(name="sdk-delete")
    pid = body["project"]["id"]
    assert neon.project_delete(pid).project.id == pid
    (op,) = [
        o
        for o in api.http.get(f"/projects/{pid}/operations").json()["operations"]
        if o["action"] == "delete_tenant"
    ]
    (done,) = api.wait_operations(pid, [op["id"]])
    assert done["status"] == "finished"
    with pytest.raises(ValidationError, match="delete_tenant"):
        neon.operation(pid, op["id"])


def test_sdk_surfaces_errors(neon: NeonAPI) -> None:
    with pytest.raises(NeonAPIError):
        neon.project("no-such-project-1")


def test_sdk_parses_branch_endpoint_role_and_database_responses(neon: NeonAPI) -> None:
    me = neon.me()
    assert me.email.endswith("@example.com")
    created = neon.project_create(project={"name": "sdk-branches"})
    pid = created.project.id
    raw_ops = neon.operations(pid).operations
    _wait(neon, pid, [o.id for o in raw_ops])

    main = next(b for b in neon.branches(pid).branches if b.default)
    branch = neon.branch_create(pid, branch={"name": "sdk-dev"}, endpoints=[{"type": "read_write"}])
    assert branch.branch.name == "sdk-dev"
    _wait(neon, pid, [o.id for o in branch.operations])
    bid = branch.branch.id
    assert neon.branch(pid, bid).branch.current_state == "ready"
    assert {b.id for b in neon.branches(pid).branches} == {main.id, bid}
    assert neon.branch_update(pid, bid, branch={"name": "sdk-dev-2"}).branch.name == "sdk-dev-2"

    endpoints = neon.endpoints(pid).endpoints
    assert len(endpoints) == 2
    ep = next(e for e in endpoints if e.branch_id == bid)
    assert neon.endpoint(pid, ep.id).endpoint.current_state.value == "active"
    suspended = neon.endpoint_suspend(pid, ep.id)
    _wait(neon, pid, [o.id for o in suspended.operations])
    started = neon.endpoint_start(pid, ep.id)
    _wait(neon, pid, [o.id for o in started.operations])
    updated = neon.endpoint_update(pid, ep.id, endpoint={"suspend_timeout_seconds": 300})
    assert updated.endpoint.suspend_timeout_seconds == 300

    role = neon.role_create(pid, bid, "sdk_role")
    assert role.role.password
    _wait(neon, pid, [o.id for o in role.operations])
    assert neon.role_password_reveal(pid, bid, "sdk_role").password == role.role.password
    assert "sdk_role" in [r.name for r in neon.roles(pid, bid).roles]
    assert neon.role(pid, bid, "sdk_role").role.name == "sdk_role"
    reset = neon.role_password_reset(pid, bid, "sdk_role")
    _wait(neon, pid, [o.id for o in reset.operations])

    database = neon.database_create(pid, bid, database={"name": "sdk_db", "owner_name": "sdk_role"})
    assert database.database.name == "sdk_db"
    assert "sdk_db" in [d.name for d in neon.databases(pid, bid).databases]
    assert neon.database(pid, bid, "sdk_db").database.owner_name == "sdk_role"
    uri = neon.connection_uri(pid, database_name="neondb", role_name="neondb_owner")
    assert uri.uri.startswith("postgresql://")

    neon.database_delete(pid, bid, "sdk_db")
    deleted_role = neon.role_delete(pid, bid, "sdk_role")
    _wait(neon, pid, [o.id for o in deleted_role.operations])
    assert neon.branch_set_as_primary(pid, bid).branch.default is True
    neon.branch_set_as_primary(pid, main.id)
    endpoint_gone = neon.endpoint_delete(pid, ep.id)
    _wait(neon, pid, [o.id for o in endpoint_gone.operations])
    gone = neon.branch_delete(pid, bid)
    _wait(neon, pid, [o.id for o in gone.operations])
    neon.project_delete(pid)
