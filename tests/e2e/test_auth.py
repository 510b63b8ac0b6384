"""Contract §5 and §7: every request needs a live key; anything else is the same 401."""

from __future__ import annotations

import http.client
import json

import httpx
import pytest

from pgplane.core import keys
from tests.stores import server_store
from tests.support import Api, Server, running_server

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores


def _error(r: httpx.Response) -> dict:
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"code", "message", "request_id"}
    assert body["code"] and body["message"]
    return dict(body)


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Basic dXNlcjpwYXNz",
        "Bearer not-a-key",
        "Bearer pgp_" + "A" * 60,  # right prefix and length, wrong checksum
        "Token pgp_" + "A" * 60,
    ],
)
def test_missing_or_invalid_key_is_401(server: Server, authorization: str | None) -> None:
    headers = {} if authorization is None else {"Authorization": authorization}
    r = httpx.get(f"{server.base_url}/projects", headers=headers)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == "Bearer"
    assert _error(r)["code"] == "UNAUTHORIZED"


def _get_raw(server: Server, authorization: str) -> tuple[int, dict[str, str], bytes]:
    """GET /projects with an Authorization header sent byte for byte (httpx refuses a value
    with trailing whitespace, as in ``Bearer `` with nothing after it)."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("GET", "/api/v2/projects", headers={"Authorization": authorization})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_every_wrong_key_gets_the_same_401(server: Server, api: Api) -> None:
    """Scenario A1: nothing in a 401 tells a missing key from a forged, unknown or revoked one."""
    revoked = api.http.post("/api_keys", json={"key_name": "revoked"}).json()
    assert api.http.delete(f"/api_keys/{revoked['id']}").status_code == 200
    valid = keys.generate()
    wrong_checksum = valid[:-1] + ("A" if valid[-1] != "A" else "B")
    cases = {
        "none": None,
        "empty Bearer": "Bearer ",
        "Basic": "Basic dXNlcjpwYXNz",
        "wrong checksum": f"Bearer {wrong_checksum}",
        "never issued": f"Bearer {keys.generate()}",
        "revoked": f"Bearer {revoked['key']}",
    }
    answers = {}
    for case, authorization in cases.items():
        if authorization is None:
            r = httpx.get(f"{server.base_url}/projects")
            status, headers, body = r.status_code, dict(r.headers), r.content
        else:
            status, headers, body = _get_raw(server, authorization)
        assert status == 401, case
        assert headers["www-authenticate"] == "Bearer", case
        assert headers["content-type"].startswith("application/json"), case
        error = json.loads(body)
        assert set(error) == {"code", "message", "request_id"}, case
        error.pop("request_id")
        headers.pop("date")
        answers[case] = (error, headers)
    assert all(answer == answers["none"] for answer in answers.values()), answers


def test_a_key_anywhere_but_the_authorization_header_is_ignored(
    server: Server, api: Api, other_api: Api
) -> None:
    """Scenario A6: ``?api_key=`` authenticates nothing and no key is echoed in an error body."""
    r = httpx.get(f"{server.base_url}/projects", params={"api_key": api.key})
    assert r.status_code == 401
    assert api.key not in r.text

    # Nor does it stand in for a revoked header key, or switch a valid one to its account.
    gone = api.http.post("/api_keys", json={"key_name": "gone"}).json()
    api.http.delete(f"/api_keys/{gone['id']}")
    r = httpx.get(
        f"{server.base_url}/projects",
        params={"api_key": api.key},
        headers={"Authorization": f"Bearer {gone['key']}"},
    )
    assert r.status_code == 401
    mine = {k["id"] for k in api.http.get("/api_keys").json()}
    listed = other_api.http.get("/api_keys", params={"api_key": api.key}).json()
    assert listed
    assert not mine & {k["id"] for k in listed}

    # A client that sends its key as its request id does not get it back in an error body.
    for client, path in ((httpx, f"{server.base_url}/projects"), (api.http, "/projects/nope")):
        r = client.get(path, headers={"X-Request-ID": api.key})
        assert r.status_code in (401, 404)
        assert api.key not in r.text
        assert r.json()["request_id"]


def test_revocation_applies_to_the_very_next_request(server: Server, api: Api) -> None:
    second = api.http.post("/api_keys", json={"key_name": "second"}).json()
    with Api(server, second["key"]) as other:
        assert other.http.get("/projects").status_code == 200

        revoked = api.http.delete(f"/api_keys/{second['id']}")
        assert revoked.status_code == 200
        assert revoked.json()["revoked"] is True

        r = other.http.get("/projects")
        assert r.status_code == 401
        assert other.http.post("/api_keys", json={"key_name": "sneaky"}).status_code == 401
        # The revoking key still works, and a second revoke is a 404.
        assert api.http.get("/projects").status_code == 200
        assert api.http.delete(f"/api_keys/{second['id']}").status_code == 404


def test_no_route_brings_a_revoked_key_back(server: Server, api: Api) -> None:
    """Scenario A3: revocation is irreversible; a key has no route but DELETE."""
    key = api.http.post("/api_keys", json={"key_name": "once"}).json()
    api.http.delete(f"/api_keys/{key['id']}")
    for method in ("PATCH", "PUT", "POST", "GET"):
        r = api.http.request(method, f"/api_keys/{key['id']}", json={"revoked": False})
        assert r.status_code == 405, (method, r.text)
        assert set(r.headers["allow"].replace(" ", "").split(",")) == {"DELETE", "OPTIONS"}
        _error(r)
    doc = httpx.get(f"{server.base_url}/openapi.json").json()["paths"]
    key_routes = {(path, m) for path, methods in doc.items() if "api_keys" in path for m in methods}
    assert key_routes == {
        ("/api/v2/api_keys", "get"),
        ("/api/v2/api_keys", "post"),
        ("/api/v2/api_keys/{key_id}", "delete"),
    }
    with Api(server, key["key"]) as revoked:
        assert revoked.http.get("/projects").status_code == 401


def test_revocation_survives_a_restart(store_backend: str) -> None:
    """Scenario A3 across a restart, and A2 on a store of its own: values never written down."""
    with running_server(store=server_store(store_backend)) as srv:
        _, first = srv.create_key("restart@example.com")
        with Api(srv, first) as api:
            second = api.http.post("/api_keys", json={"key_name": "second"}).json()
            with Api(srv, second["key"]) as other:
                assert other.http.get("/projects").status_code == 200
                assert api.http.delete(f"/api_keys/{second['id']}").status_code == 200
                assert other.http.get("/projects").status_code == 401

        srv.stop()
        srv.start()

        with Api(srv, first) as api, Api(srv, second["key"]) as other:
            assert other.http.get("/projects").status_code == 401
            assert api.http.get("/projects").status_code == 200
            assert second["id"] not in {k["id"] for k in api.http.get("/api_keys").json()}
            assert api.http.delete(f"/api_keys/{second['id']}").status_code == 404
        written = srv.store_and_logs()
        assert keys.digest(second["key"]).encode() in written  # the right files were read
        assert first.encode() not in written
        assert second["key"].encode() not in written


def test_a_key_can_revoke_itself(server: Server, api: Api) -> None:
    me = api.http.post("/api_keys", json={"key_name": "self"}).json()
    with Api(server, me["key"]) as client:
        assert client.http.delete(f"/api_keys/{me['id']}").status_code == 200
        assert client.http.get("/api_keys").status_code == 401


def test_every_route_in_the_openapi_document_requires_a_key(server: Server) -> None:
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    assert doc["components"]["securitySchemes"]["BearerAuth"]["scheme"] == "bearer"
    checked = 0
    for path, methods in doc["paths"].items():
        url = server.base_url + path.removeprefix("/api/v2").format(
            project_id="some-project-12345678",
            operation_id="00000000-0000-4000-8000-000000000000",
            key_id=1,
            branch_id="br-some-branch-12345678",
            endpoint_id="ep-some-endpoint-12345678",
            role_name="someone",
            database_name="somedb",
            snapshot_id="snap-some-snapshot-12345678",
        )
        for method in methods:
            r = httpx.request(method.upper(), url, json={})
            assert r.status_code == 401, (method, path, r.text)
            checked += 1
    assert checked >= 40
