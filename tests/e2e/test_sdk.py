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
