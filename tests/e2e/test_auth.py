"""Contract §5 and §7: every request needs a live key; anything else is the same 401."""

from __future__ import annotations

import httpx
import pytest

from tests.support import Api, Server


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


def test_well_formed_key_never_issued_is_401(server: Server) -> None:
    from pgplane.core import keys

    r = httpx.get(
        f"{server.base_url}/projects", headers={"Authorization": f"Bearer {keys.generate()}"}
    )
    assert r.status_code == 401


def test_all_401_bodies_are_identical(server: Server, api: Api) -> None:
    bodies = []
    for headers in ({}, {"Authorization": "Basic x"}, {"Authorization": "Bearer " + "x" * 64}):
        body = _error(httpx.get(f"{server.base_url}/projects", headers=headers))
        body.pop("request_id")
        bodies.append(body)
    assert bodies[0] == bodies[1] == bodies[2]


def test_key_in_query_string_is_ignored(server: Server, api: Api) -> None:
    r = httpx.get(f"{server.base_url}/projects", params={"api_key": api.key})
    assert r.status_code == 401


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
        )
        for method in methods:
            r = httpx.request(method.upper(), url, json={})
            assert r.status_code == 401, (method, path, r.text)
            checked += 1
    assert checked >= 40
