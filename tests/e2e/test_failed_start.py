"""A compute that cannot start reads as such: its operation fails once, with the reason its own
Postgres gave (this start's words, not an earlier run's log), the endpoint stops saying a start
is under way, its duration is the time it took, and a settings change brings it back."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pgplane.core import clock
from tests.support import Api, running_server

RETRY_PAUSE_MS = 2000  # between the two attempts


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    # Two attempts, not five: the reason is the same each time.
    with running_server(
        PGPLANE_MAX_ATTEMPTS="2", PGPLANE_RETRY_BASE_SECONDS=str(RETRY_PAUSE_MS / 1000)
    ) as server:
        _, key = server.create_key("failed-start@example.com")
        with Api(server, key) as api:
            yield api


def test_a_start_that_fails_says_why_once_and_a_settings_change_mends_it(api: Api) -> None:
    body = api.create_ready_project()
    pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
    # Valid to Postgres' own checks of the value, refused by its start-up: fewer connections
    # than it reserves for superusers.
    broken = {"pg_settings": {"max_connections": "1"}}
    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": {"settings": broken}})
    assert r.status_code == 200, r.text
    [op] = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert op["status"] == "failed"
    assert op["error"].count('"max_connections" (1)') == 1, op["error"]
    assert "superuser_reserved_connections" in op["error"]
    assert "database system is ready" not in op["error"]  # not the previous run's log
    # Retried once, and the time it took is the time it took: from its first start, which
    # nothing queued ahead of, to its end. The pause before the retry counts (the sum of the
    # attempts alone falls short of the time since creation by at least that pause; it said
    # 149 ms for 15 s of retries).
    assert op["failures_count"] == 2
    since_created = (clock.parse_us(op["updated_at"]) - clock.parse_us(op["created_at"])) // 1000
    took = op["total_duration_ms"]
    assert RETRY_PAUSE_MS <= took <= since_created + 1, (op, since_created)
    assert since_created - took < RETRY_PAUSE_MS, (op, since_created)  # only the wait to start
    endpoint = api.endpoint(pid, eid)
    assert (endpoint["current_state"], endpoint.get("pending_state")) == ("idle", None)

    fixed = {"pg_settings": {"max_connections": "20"}}
    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": {"settings": fixed}})
    assert r.status_code == 200, r.text
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/start")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"] * len(ops)
    assert api.endpoint(pid, eid)["current_state"] == "active"
