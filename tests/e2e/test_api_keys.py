"""Contract §2.1 and §3.1: API keys are created (shown once), listed and revoked."""

from __future__ import annotations

import re
import time

import httpx
import pytest

from pgplane.core import keys
from tests.support import Api, Server

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$")


def test_create_returns_the_value_once(api: Api) -> None:
    r = api.http.post("/api_keys", json={"key_name": "ci"})
    assert r.status_code == 200
    body = r.json()
    assert isinstance(body["id"], int)
    assert re.fullmatch(r"pgp_[0-9A-Za-z]{60}", body["key"])
    assert body["name"] == "ci"
    assert TIMESTAMP.match(body["created_at"])
    assert isinstance(body["created_by"], str)

    listed = api.http.get("/api_keys").json()
    item = next(k for k in listed if k["id"] == body["id"])
    assert set(item) == {
        "id", "name", "created_at", "created_by", "last_used_at", "last_used_from_addr"
    }  # fmt: skip
    listed_text = api.http.get("/api_keys").text
    assert body["key"] not in listed_text
    assert keys.digest(body["key"]) not in listed_text
    assert item["last_used_at"] is None
    assert item["last_used_from_addr"] == ""
    assert set(item["created_by"]) == {"id", "name", "image"}


def test_list_is_newest_first_and_excludes_revoked(api: Api) -> None:
    ids = [api.http.post("/api_keys", json={"key_name": f"k{i}"}).json()["id"] for i in range(3)]
    api.http.delete(f"/api_keys/{ids[1]}")
    listed = [k["id"] for k in api.http.get("/api_keys").json()]
    assert ids[1] not in listed
    assert listed.index(ids[2]) < listed.index(ids[0])
    assert listed == sorted(listed, reverse=True)


def test_revoke_response(api: Api) -> None:
    key = api.http.post("/api_keys", json={"key_name": "gone"}).json()
    r = api.http.delete(f"/api_keys/{key['id']}")
    assert r.status_code == 200
    body = r.json()
    assert body["id"] == key["id"]
    assert body["name"] == "gone"
    assert body["revoked"] is True
    assert "last_used_at" in body
    assert body["last_used_from_addr"] == ""
    assert "key" not in body


def test_last_use_is_recorded(server: Server, api: Api) -> None:
    key = api.http.post("/api_keys", json={"key_name": "used"}).json()
    with Api(server, key["key"]) as used:
        assert used.http.get("/projects").status_code == 200
        deadline = time.monotonic() + 10
        while True:
            item = next(k for k in api.http.get("/api_keys").json() if k["id"] == key["id"])
            if item["last_used_at"] is not None:
                break
            assert time.monotonic() < deadline, item
            time.sleep(0.1)
        assert TIMESTAMP.match(item["last_used_at"])
        assert item["last_used_from_addr"] == "127.0.0.1"


def test_key_values_are_never_written_down(server: Server, api: Api) -> None:
    """Scenario A2: after keys are made, used, misused and revoked, neither the store (with its
    WAL) nor any log holds a value; the store holds their digests."""
    made = [api.http.post("/api_keys", json={"key_name": f"secret-{i}"}).json() for i in range(3)]
    values = [api.key, *(k["key"] for k in made)]
    for value in values:
        with Api(server, value) as client:
            assert client.http.get("/projects").status_code == 200
        # The same value where it does not belong: each answer is an error, none is logged.
        assert (
            httpx.get(f"{server.base_url}/projects", params={"api_key": value}).status_code == 401
        )
        basic = httpx.get(f"{server.base_url}/projects", auth=(value, value))
        assert basic.status_code == 401
        assert api.http.get(f"/projects/{value}").status_code in (400, 404)
    api.http.delete(f"/api_keys/{made[0]['id']}")
    with Api(server, made[0]["key"]) as revoked:
        assert revoked.http.get("/projects").status_code == 401

    deadline = time.monotonic() + 10  # until the uses are recorded: the store was written to
    while any(k["last_used_at"] is None for k in api.http.get("/api_keys").json()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    written = server.store_and_logs()
    for value in values:
        assert keys.digest(value).encode() in written
        assert value.encode() not in written


def _keys_but_their_use(api: Api) -> list[dict[str, object]]:
    # The key making these requests is used by them: when that use is flushed to the store
    # (every PGPLANE_KEY_USE_FLUSH_SECONDS) is not this test's to know.
    used = {"last_used_at", "last_used_from_addr"}
    return [
        {k: v for k, v in key.items() if k not in used} for key in api.http.get("/api_keys").json()
    ]


def test_bad_key_requests_change_nothing(api: Api) -> None:
    before = _keys_but_their_use(api)
    for body in ({}, {"key_name": ""}, {"key_name": "x" * 65}, {"key_name": 5}, []):
        r = api.http.post("/api_keys", json=body)
        assert r.status_code == 400, (body, r.text)
        assert set(r.json()) == {"code", "message", "request_id"}
    r = api.http.post(
        "/api_keys", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400
    # Past 64 bits too: a number that names no key, not a 500 from the store.
    for key_id in ("999999999", "0", "-1", str(2**63), "9" * 30):
        r = api.http.delete(f"/api_keys/{key_id}")
        assert r.status_code == 404 and r.json()["code"] == "NOT_FOUND", (key_id, r.text)
    assert api.http.delete("/api_keys/abc").status_code in (400, 404)
    assert _keys_but_their_use(api) == before


def test_no_small_limit_on_keys_per_account(api: Api) -> None:
    """Contract §8: no strict limit on keys per account (keep below 10,000 is advice)."""
    made = {
        api.http.post("/api_keys", json={"key_name": f"many-{i}"}).json()["id"] for i in range(150)
    }
    listed = {k["id"] for k in api.http.get("/api_keys").json()}
    assert made <= listed
