"""Contract §2.3, §2.4 and §4 rules 1-5: operations are listed newest first and paged exactly."""

from __future__ import annotations

import re
import uuid
from urllib.parse import quote

import pytest

from tests.support import Api

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

OP_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")
OP_FIELDS = {
    "id", "project_id", "action", "status", "failures_count", "created_at", "updated_at",
    "total_duration_ms",
}  # fmt: skip


def _project_with_history(api: Api, renames: int = 3) -> tuple[str, list[str]]:
    """A project with several operations: create_timeline, start_compute, then storage configs."""
    body = api.create_ready_project(name="history")
    pid = body["project"]["id"]
    ids = [o["id"] for o in body["operations"]]
    for i in range(renames):
        r = api.http.patch(
            f"/projects/{pid}", json={"project": {"history_retention_seconds": 3600 + i}}
        )
        assert r.status_code == 200, r.text
        ids += [o["id"] for o in r.json()["operations"]]
    api.wait_operations(pid, ids)
    return pid, ids


def test_create_project_operations_and_their_fields(api: Api) -> None:
    body = api.create_project(name="ops")
    ops = body["operations"]
    assert [o["action"] for o in ops] == ["create_timeline", "start_compute"]
    assert ops[0]["status"] in ("running", "scheduling", "finished")
    assert ops[1]["status"] == "scheduling"
    for op in ops:
        assert set(op) >= OP_FIELDS
        assert uuid.UUID(op["id"]).version == 4
        assert op["project_id"] == body["project"]["id"]
        assert op["branch_id"] == body["branch"]["id"]
        assert op["failures_count"] == 0
        assert OP_TIMESTAMP.match(op["created_at"]) and OP_TIMESTAMP.match(op["updated_at"])
    assert "endpoint_id" not in ops[0]  # create_timeline involves no compute
    assert ops[1]["endpoint_id"] == body["endpoints"][0]["id"]
    settled = api.wait_operations(body["project"]["id"], [o["id"] for o in ops])
    for op in settled:
        assert op["status"] == "finished"
        assert op["total_duration_ms"] >= 0
        assert "error" not in op


def test_list_is_newest_first_and_limit_is_honoured(api: Api) -> None:
    pid, ids = _project_with_history(api)
    full = api.http.get(f"/projects/{pid}/operations", params={"limit": 100}).json()
    listed = full["operations"]
    assert [o["id"] for o in listed] == list(reversed(ids))
    stamps = [o["created_at"] for o in listed]
    assert stamps == sorted(stamps, reverse=True)
    assert len(set(stamps)) == len(stamps)
    for limit in (1, 2, 4):
        page = api.http.get(f"/projects/{pid}/operations", params={"limit": limit}).json()
        assert len(page["operations"]) == limit
    # Without limit: the default of 10 (here everything, 5 operations).
    assert len(api.http.get(f"/projects/{pid}/operations").json()["operations"]) == len(ids)


def test_paging_with_limit_1_visits_each_operation_exactly_once(api: Api) -> None:
    body = api.create_project(name="paging")  # create_timeline + start_compute, one request
    pid = body["project"]["id"]
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        params: dict[str, object] = {"limit": 1}
        if cursor is not None:
            params["cursor"] = cursor
        page = api.http.get(f"/projects/{pid}/operations", params=params).json()
        if not page["operations"]:
            assert page["pagination"]["cursor"] == cursor  # the end: the cursor comes back
            break
        assert len(page["operations"]) == 1
        seen.append(page["operations"][0]["id"])
        cursor = page["pagination"]["cursor"]
        assert cursor == page["operations"][0]["created_at"]
        assert re.search(r"\.\d{6}Z$", cursor)  # sub-second precision
    assert sorted(seen) == sorted(o["id"] for o in body["operations"])
    assert len(seen) == len(set(seen))
    api.wait_operations(pid, seen)


def test_cursor_is_accepted_url_encoded(api: Api) -> None:
    pid, ids = _project_with_history(api, renames=1)
    first = api.http.get(f"/projects/{pid}/operations", params={"limit": 1}).json()
    cursor = first["pagination"]["cursor"]
    raw = api.http.get(f"/projects/{pid}/operations?limit=2&cursor={quote(cursor, safe='')}")
    assert raw.status_code == 200
    assert [o["id"] for o in raw.json()["operations"]] == list(reversed(ids))[1:3]


def test_pages_of_every_size_cover_the_list(api: Api) -> None:
    pid, ids = _project_with_history(api, renames=4)
    for limit in (1, 2, 3, 5, 1000):
        seen, cursor = [], None
        while True:
            params: dict[str, object] = {"limit": limit}
            if cursor:
                params["cursor"] = cursor
            page = api.http.get(f"/projects/{pid}/operations", params=params).json()
            if not page["operations"]:
                break
            assert len(page["operations"]) <= limit
            seen += [o["id"] for o in page["operations"]]
            cursor = page["pagination"]["cursor"]
        assert seen == list(reversed(ids)), limit


def test_get_operation_and_unknown_ids(api: Api, other_api: Api) -> None:
    body = api.create_project(name="get-op")
    pid, op = body["project"]["id"], body["operations"][0]
    got = api.http.get(f"/projects/{pid}/operations/{op['id']}")
    assert got.status_code == 200
    assert got.json()["operation"]["id"] == op["id"]
    missing = api.http.get(f"/projects/{pid}/operations/{uuid.uuid4()}")
    assert missing.status_code == 404
    assert api.http.get(f"/projects/{pid}/operations/not-a-uuid").status_code == 404
    # An operation of another project, under the wrong project path, does not exist there.
    other = api.create_project(name="other")
    assert (
        api.http.get(f"/projects/{other['project']['id']}/operations/{op['id']}").status_code == 404
    )
    # Nor for another account.
    foreign = other_api.http.get(f"/projects/{pid}/operations/{op['id']}")
    assert foreign.status_code == 404
    assert other_api.http.get(f"/projects/{pid}/operations").status_code == 404
    api.wait_operations(pid, [o["id"] for o in body["operations"]])
    api.wait_operations(other["project"]["id"], [o["id"] for o in other["operations"]])


def test_bad_limits_and_cursors_are_400(api: Api) -> None:
    body = api.create_project(name="bad-paging")
    pid = body["project"]["id"]
    for params in (
        {"limit": 0},
        {"limit": 1001},
        {"limit": -1},
        {"limit": "ten"},
        {"cursor": "yesterday"},
        {"cursor": "2025-01-16T21:02:04.214837"},  # no zone
        {"cursor": "2025-13-45T99:99:99Z"},
    ):
        r = api.http.get(f"/projects/{pid}/operations", params=params)
        assert r.status_code == 400, (params, r.text)
        assert set(r.json()) == {"code", "message", "request_id"}
    api.wait_operations(pid, [o["id"] for o in body["operations"]])
