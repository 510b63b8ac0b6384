"""Expiring branches through the HTTP API, on a real server: set, moved, cleared, refused, and
deleted on time by the ordinary deletion (one ``delete_timeline`` in the project's operations),
also when ``serve`` was down at that moment, and never twice.

One server for the file (the scheduler's default tick, as users run it); each test makes its
own account and project.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from pgplane.core import clock
from tests.support import Api, Server, running_server, wait_for

_US = 1_000_000
MINUTE = 60


@pytest.fixture(scope="module")
def expiry_server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture
def xapi(expiry_server: Server) -> Iterator[Api]:
    _, key = expiry_server.create_key(f"expiry-{time.monotonic_ns()}@example.com")
    with Api(expiry_server, key) as client:
        yield client


def in_seconds(seconds: float) -> str:
    """An RFC 3339 time ``seconds`` from now, whole seconds (rounded up), as clients send it."""
    return clock.format_s(clock.now_us() + int(seconds * _US) + _US - 1)


def project(api: Api) -> tuple[str, str]:
    body = api.create_ready_project(name="expiring")
    return body["project"]["id"], body["branch"]["id"]


def branch(api: Api, pid: str, **fields: Any) -> dict[str, Any]:
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": fields, "endpoints": [{"type": "read_write"}]},
    )
    return api.settled(pid, r)["branch"]


def deletions(api: Api, pid: str, branch_id: str) -> list[dict[str, Any]]:
    return [
        o
        for o in api.operations(pid)
        if o["action"] == "delete_timeline" and o["branch_id"] == branch_id
    ]


def gone(api: Api, pid: str, branch_id: str) -> bool:
    return api.http.get(f"/projects/{pid}/branches/{branch_id}").status_code == 404


def test_an_expired_branch_is_deleted_on_time_once(xapi: Api, expiry_server: Server) -> None:
    pid, _ = project(xapi)
    # Made to expire in an hour and read back, then brought to a few seconds away: the reads
    # never race the deletion, however long a loaded machine takes to make the branch.
    later = in_seconds(3600)
    made = branch(xapi, pid, name="preview", expires_at=later)
    assert made["expires_at"] == later
    assert made["ttl_interval_seconds"] in (3600, 3601)
    got = xapi.http.get(f"/projects/{pid}/branches/{made['id']}").json()["branch"]
    assert (got["expires_at"], got["ttl_interval_seconds"]) == (later, made["ttl_interval_seconds"])
    listed = xapi.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert [b["expires_at"] for b in listed if b["id"] == made["id"]] == [later]
    at = in_seconds(2)
    r = xapi.http.patch(
        f"/projects/{pid}/branches/{made['id']}", json={"branch": {"expires_at": at}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["branch"]["expires_at"] == at

    wait_for(
        "the branch deleted", lambda: gone(xapi, pid, made["id"]), MINUTE, server=expiry_server
    )
    (op,) = deletions(xapi, pid, made["id"])
    (op,) = xapi.wait_operations(pid, [op["id"]])
    assert op["status"] == "finished", op
    due = clock.parse_us(at)
    assert due <= clock.parse_us(op["created_at"]) < due + MINUTE * _US
    branch_dir = expiry_server.data_dir / "projects" / pid / "branches" / made["id"]
    assert not branch_dir.exists()
    # Its compute went with it, and later ticks start nothing more.
    endpoints = xapi.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
    assert made["id"] not in {e["branch_id"] for e in endpoints}
    expiry_server.wait_for_ticks(2)
    assert len(deletions(xapi, pid, made["id"])) == 1


def test_patch_sets_moves_and_clears_the_expiry(xapi: Api, expiry_server: Server) -> None:
    pid, _ = project(xapi)
    made = branch(xapi, pid, name="kept")
    assert "expires_at" not in made and "ttl_interval_seconds" not in made
    url = f"/projects/{pid}/branches/{made['id']}"

    later = in_seconds(3600)
    r = xapi.http.patch(url, json={"branch": {"expires_at": later}})
    assert r.status_code == 200, r.text
    assert (r.json()["branch"]["expires_at"], r.json()["operations"]) == (later, [])
    assert r.json()["branch"]["ttl_interval_seconds"] in (3600, 3601)

    # A PATCH that does not name it leaves it; fractions and offsets are taken, kept to the second.
    r = xapi.http.patch(url, json={"branch": {"name": "renamed"}})
    assert r.json()["branch"]["expires_at"] == later
    moved = clock.parse_us(in_seconds(7200)) // _US
    offset = time.strftime("%Y-%m-%dT%H:%M:%S.750+02:00", time.gmtime(moved + 7200))
    r = xapi.http.patch(url, json={"branch": {"expires_at": offset}})
    assert r.status_code == 200, r.text
    assert r.json()["branch"]["expires_at"] == clock.format_s(moved * _US)

    # Cleared with null: it shows no expiry, and its time passes without a deletion.
    soon = in_seconds(2)
    assert xapi.http.patch(url, json={"branch": {"expires_at": soon}}).status_code == 200
    r = xapi.http.patch(url, json={"branch": {"expires_at": None}})
    assert r.status_code == 200, r.text
    assert "expires_at" not in r.json()["branch"]
    assert "ttl_interval_seconds" not in r.json()["branch"]
    # Its time passes (the clock's own condition), and the scheduler looks after that.
    time.sleep(max(0.0, (clock.parse_us(soon) - clock.now_us()) / _US))
    expiry_server.wait_for_ticks(2)
    assert xapi.http.get(url).json()["branch"]["name"] == "renamed"
    assert deletions(xapi, pid, made["id"]) == []


def test_a_bad_expiry_is_a_400_that_says_why_and_changes_nothing(xapi: Api) -> None:
    pid, _ = project(xapi)
    made = branch(xapi, pid, name="steady", expires_at=in_seconds(3600))
    before = (xapi.http.get(f"/projects/{pid}/branches").json(), xapi.operations(pid))
    for value, why in [
        ("2020-01-01T00:00:00Z", "expires_at must be in the future: 2020-01-01T00:00:00Z has"),
        (in_seconds(-1), "must be in the future"),
        (in_seconds(31 * 86400), "expires_at must be at most 30 days ahead"),
        ("past", "expires_at must be an RFC 3339 time"),
        ("2030-01-01T00:00:00", "expires_at must say its time zone"),
        ("2030-13-01T00:00:00Z", "expires_at must be an RFC 3339 time"),
        (1700000000, "branch.expires_at: Expected `str | null`"),
    ]:
        r = xapi.http.post(f"/projects/{pid}/branches", json={"branch": {"expires_at": value}})
        assert r.status_code == 400, r.text
        assert why in r.json()["message"], (value, r.text)
        r = xapi.http.patch(
            f"/projects/{pid}/branches/{made['id']}",
            json={"branch": {"name": "moved", "expires_at": value}},
        )
        assert r.status_code == 400, r.text
        assert why in r.json()["message"], (value, r.text)
    assert (xapi.http.get(f"/projects/{pid}/branches").json(), xapi.operations(pid)) == before


def test_default_protected_and_parent_branches_never_expire(xapi: Api) -> None:
    pid, main = project(xapi)
    soon = in_seconds(3600)

    def refused(r: Any, *words: str) -> None:
        assert r.status_code == 400, r.text
        assert all(w in r.json()["message"] for w in words), r.text

    # The default branch; a protected one, made or marked so.
    refused(
        xapi.http.patch(f"/projects/{pid}/branches/{main}", json={"branch": {"expires_at": soon}}),
        "expires_at",
        "default",
    )
    refused(
        xapi.http.post(
            f"/projects/{pid}/branches",
            json={"branch": {"name": "p", "protected": True, "expires_at": soon}},
        ),
        "expires_at",
        "protected",
    )
    guarded = branch(xapi, pid, name="guarded", protected=True)
    refused(
        xapi.http.patch(
            f"/projects/{pid}/branches/{guarded['id']}", json={"branch": {"expires_at": soon}}
        ),
        "expires_at",
        "protected",
    )
    # A parent.
    parent = branch(xapi, pid, name="parent")
    branch(xapi, pid, name="child", parent_id=parent["id"])
    refused(
        xapi.http.patch(
            f"/projects/{pid}/branches/{parent['id']}", json={"branch": {"expires_at": soon}}
        ),
        "expires_at",
        "child",
    )
    # And the other way round: an expiring branch cannot become any of them.
    expiring = branch(xapi, pid, name="expiring", expires_at=soon)
    url = f"/projects/{pid}/branches/{expiring['id']}"
    refused(xapi.http.patch(url, json={"branch": {"protected": True}}), "protected", "expires")
    refused(xapi.http.post(f"{url}/set_as_default"), "default", "expires_at")
    refused(
        xapi.http.post(
            f"/projects/{pid}/branches",
            json={"branch": {"name": "grandchild", "parent_id": expiring["id"]}},
        ),
        "parent_id",
        "children",
    )
    branches = xapi.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert sorted(b["name"] for b in branches) == ["child", "expiring", "guarded", "main", "parent"]
    by_name = {b["name"]: b for b in branches}
    assert by_name["main"]["default"] and "expires_at" not in by_name["main"]
    assert not by_name["expiring"]["protected"] and not by_name["expiring"]["default"]
    assert "expires_at" not in by_name["guarded"] and "expires_at" not in by_name["parent"]
    # Cleared and protected in one request is fine.
    r = xapi.http.patch(url, json={"branch": {"protected": True, "expires_at": None}})
    assert r.status_code == 200 and r.json()["branch"]["protected"], r.text


def test_a_reset_counts_the_interval_again(xapi: Api) -> None:
    pid, main = project(xapi)
    made = branch(xapi, pid, name="reset-me", expires_at=in_seconds(600))
    ttl = made["ttl_interval_seconds"]
    time.sleep(2)
    r = xapi.http.post(
        f"/projects/{pid}/branches/{made['id']}/restore", json={"source_branch_id": main}
    )
    restored = xapi.settled(pid, r)["branch"]
    assert restored["ttl_interval_seconds"] == ttl
    assert clock.parse_us(restored["expires_at"]) >= clock.parse_us(made["expires_at"]) + _US


def test_a_branch_due_while_serve_was_down_goes_when_it_starts(
    xapi: Api, expiry_server: Server
) -> None:
    pid, _ = project(xapi)
    at = in_seconds(3)
    made = branch(xapi, pid, name="overnight", expires_at=at)
    expiry_server.stop()
    try:
        time.sleep(max(0.0, (clock.parse_us(at) - clock.now_us()) / _US) + 2)
    finally:
        expiry_server.start()
    started = time.monotonic()
    wait_for(
        "the branch deleted", lambda: gone(xapi, pid, made["id"]), MINUTE, server=expiry_server
    )
    assert time.monotonic() - started < 10
    (op,) = deletions(xapi, pid, made["id"])
    assert xapi.wait_operations(pid, [op["id"]])[0]["status"] == "finished"
    expiry_server.wait_for_ticks(2)
    assert len(deletions(xapi, pid, made["id"])) == 1
