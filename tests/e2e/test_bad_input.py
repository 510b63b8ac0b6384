"""Bad input (scenarios B3-B5): every refusal is a 4xx error body, and refused input changes
nothing: no object, no operation, no file outside the data directory, the same server process.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from pgplane.config import Settings
from tests.support import Api, Server, make_data_dir, path_parameters, running_server

MAX_BODY = Settings().max_body_bytes


def _error(r: httpx.Response, *statuses: int) -> dict[str, Any]:
    assert r.status_code in statuses, (r.status_code, r.text[:500])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"code", "message", "request_id"} and body["code"] and body["message"]
    return dict(body)


def _state(api: Api) -> tuple[Any, ...]:
    """What bad input must not change: the account's projects and keys."""
    projects = api.http.get("/projects", params={"limit": 400}).json()["projects"]
    keys = [(k["id"], k["name"]) for k in api.http.get("/api_keys").json()]
    return [p["id"] for p in projects], keys


def test_bodies_over_the_limit_are_413(server: Server, api: Api) -> None:
    project = api.create_project(name="big-bodies")
    pid = project["project"]["id"]
    before = _state(api)
    pad = "a" * MAX_BODY
    for method, url in (
        ("POST", "/projects"),
        ("PATCH", f"/projects/{pid}"),
        ("POST", f"/projects/{pid}/branches"),
        ("POST", "/api_keys"),
    ):
        body = json.dumps({"key_name": "x", "project": {"name": "x"}, "pad": pad}).encode()
        _error(
            api.http.request(
                method, url, content=body, headers={"Content-Type": "application/json"}
            ),
            413,
        )

        # Sent in chunks, with no Content-Length to refuse it by: still cut off at the limit.
        def chunks(data: bytes = body) -> Iterator[bytes]:
            for start in range(0, len(data), 65536):
                yield data[start : start + 65536]

        r = api.http.request(
            method, url, content=chunks(), headers={"Content-Type": "application/json"}
        )
        _error(r, 413)
    # Just under the limit is read (and the unknown field ignored).
    fits = json.dumps({"key_name": "fits", "pad": "a" * (MAX_BODY - 100)}).encode()
    assert len(fits) <= MAX_BODY
    r = api.http.post("/api_keys", content=fits, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    api.http.delete(f"/api_keys/{r.json()['id']}")
    assert _state(api) == before
    assert server.process is not None and server.process.poll() is None
    api.wait_operations(pid, [o["id"] for o in project["operations"]])


def test_names_past_their_limits_are_400_and_names_at_them_kept_whole(api: Api) -> None:
    project = api.create_ready_project(name="limits")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    branch = f"/projects/{pid}/branches/{bid}"
    base_uri = project["connection_uris"][0]["connection_uri"]
    before = _state(api)
    # 63 bytes in 32 characters: Postgres' limit is in bytes, and it would cut a longer name.
    at_limit, past_limit = "é" * 31 + "a", "é" * 32
    assert len(at_limit.encode()) == 63 and len(past_limit.encode()) == 64
    refused = [
        ("POST", "/api_keys", {"key_name": "k" * 65}),
        ("POST", "/projects", {"project": {"name": "p" * 257}}),
        ("PATCH", f"/projects/{pid}", {"project": {"name": "p" * 257}}),
        ("POST", f"/projects/{pid}/branches", {"branch": {"name": "b" * 257}}),
        ("PATCH", branch, {"branch": {"name": "b" * 257}}),
        ("POST", f"{branch}/roles", {"role": {"name": past_limit}}),
        ("POST", f"{branch}/roles", {"role": {"name": "r" * 64}}),
        ("POST", f"{branch}/roles", {"role": {"name": "a/b"}}),  # paths could not name it
        (
            "POST",
            f"{branch}/databases",
            {"database": {"name": past_limit, "owner_name": "neondb_owner"}},
        ),
        ("PATCH", f"{branch}/databases/neondb", {"database": {"name": "d" * 64}}),
        ("POST", "/projects", {"project": {"branch": {"role_name": past_limit}}}),
        ("POST", "/projects", {"project": {"branch": {"database_name": past_limit}}}),
    ]
    for method, url, body in refused:
        _error(api.http.request(method, url, json=body), 400)
    assert _state(api) == before
    ops = api.http.get(f"/projects/{pid}/operations").json()["operations"]
    assert len(ops) == len(project["operations"])  # none started by a refused request

    assert api.http.post("/api_keys", json={"key_name": "k" * 64}).status_code == 200
    r = api.http.patch(f"/projects/{pid}/branches/{bid}", json={"branch": {"name": "b" * 256}})
    assert r.status_code == 200 and r.json()["branch"]["name"] == "b" * 256
    api.settled(pid, api.http.post(f"{branch}/roles", json={"role": {"name": at_limit}}))
    api.settled(
        pid,
        api.http.post(
            f"{branch}/databases", json={"database": {"name": at_limit, "owner_name": at_limit}}
        ),
    )
    with psycopg.connect(base_uri, connect_timeout=10) as conn:
        assert conn.execute(
            "SELECT rolname FROM pg_roles WHERE rolname = %s", (at_limit,)
        ).fetchone()
        assert conn.execute(
            "SELECT datname FROM pg_database WHERE datname = %s", (at_limit,)
        ).fetchone()


ODD_ROLE = 'a"; DROP DATABASE neondb; --'
ODD_DATABASE = "x'y"


def test_odd_role_and_database_names_are_quoted_never_run(api: Api) -> None:
    """B4: names built to break out of quoting are created as they are, or refused; neondb and
    its data stay."""
    project = api.create_ready_project(name="odd-names")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    branch = f"/projects/{pid}/branches/{bid}"
    base_uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(base_uri, connect_timeout=10, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept AS SELECT 42 AS v")

    role = api.settled(pid, api.http.post(f"{branch}/roles", json={"role": {"name": ODD_ROLE}}))
    assert role["role"]["name"] == ODD_ROLE
    for name in (ODD_DATABASE, "$$; DROP DATABASE neondb; $$", "z\\'; DROP TABLE kept; --"):
        db = api.settled(
            pid,
            api.http.post(
                f"{branch}/databases", json={"database": {"name": name, "owner_name": ODD_ROLE}}
            ),
        )
        assert db["database"]["name"] == name

    # Through the running server: the URI it gives for the odd role and database works as is.
    r = api.http.get(
        f"/projects/{pid}/connection_uri",
        params={"role_name": ODD_ROLE, "database_name": ODD_DATABASE},
    )
    assert r.status_code == 200, r.text
    with psycopg.connect(r.json()["uri"], connect_timeout=10) as conn:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == (
            ODD_ROLE,
            ODD_DATABASE,
        )
        names = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        assert {"neondb", ODD_DATABASE} <= names
    with psycopg.connect(base_uri, connect_timeout=10) as conn:
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)

    # Renamed and dropped the same way: quoted, so the neighbours stay.
    renamed = "x'y\"z"
    r = api.http.patch(
        f"{branch}/databases/{quote(ODD_DATABASE, safe='')}", json={"database": {"name": renamed}}
    )
    api.settled(pid, r)
    api.settled(pid, api.http.delete(f"{branch}/databases/{quote(renamed, safe='')}"))
    with psycopg.connect(base_uri, connect_timeout=10) as conn:
        names = {row[0] for row in conn.execute("SELECT datname FROM pg_database")}
        assert "neondb" in names and renamed not in names and ODD_DATABASE not in names
        assert conn.execute("SELECT v FROM kept").fetchone() == (42,)


MALFORMED: list[tuple[str, bytes, str | None]] = [
    ("truncated JSON", b'{"key_name": "a"', "application/json"),
    ("not JSON", b"key_name=a", "application/json"),
    ("an array, not an object", b'[{"key_name": "a"}]', "application/json"),
    ("a bare string", b'"a"', "application/json"),
    ("null", b"null", "application/json"),
    ("text/plain", b'{"key_name": "a"}', "text/plain"),
    ("no content type", b'{"key_name": "a"}', None),
    ("a form", b"key_name=a", "application/x-www-form-urlencoded"),
    ("duplicate keys", b'{"key_name": "a", "key_name": "b"}', "application/json"),
    ("a number for a string", b'{"key_name": 5}', "application/json"),
    ("NaN", b'{"key_name": "a", "n": NaN}', "application/json"),
    ("invalid UTF-8", b'{"key_name": "\xff\xfe"}', "application/json"),
    ("UTF-16", '{"key_name": "a"}'.encode("utf-16"), "application/json"),
    (
        "10,000 nested arrays",
        b'{"key_name": ' + b"[" * 10000 + b"]" * 10000 + b"}",
        "application/json",
    ),
    (
        "10,000 nested objects",
        b'{"key_name": "a", "x": ' + b'{"a": ' * 10000 + b"1" + b"}" * 10000 + b"}",
        "application/json",
    ),
]


def test_malformed_requests_are_4xx_error_bodies(api: Api) -> None:
    """B5 on one route, every way: each refused with an error body, nothing created."""
    before = _state(api)
    for case, body, content_type in MALFORMED:
        headers = {"Content-Type": content_type} if content_type else {}
        r = api.http.post("/api_keys", content=body, headers=headers)
        assert r.status_code in (400, 415), (case, r.status_code, r.text)
        _error(r, 400, 415)
    assert _state(api) == before


def test_requests_http_cannot_parse_get_the_error_body_too(server: Server, api: Api) -> None:
    """Too malformed to reach the application (the HTTP parser refuses it): still the JSON error
    body, then the connection is closed, and the server serves the next request."""
    host, port = server.base_url.split("//")[1].split("/")[0].split(":")
    for raw in (
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /api/v2/projects HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
        b"GET /api/v2/projects HTTP/1.1\r\nContent-Length: banana\r\n\r\n",
        b"POST /api/v2/api_keys HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(raw)
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        assert lines[0] == "HTTP/1.1 400 Bad Request", (raw, answer)
        headers = dict(line.lower().split(": ", 1) for line in lines[1:])
        assert headers["content-type"] == "application/json", answer
        assert int(headers["content-length"]) == len(body)
        error = json.loads(body)
        assert set(error) == {"code", "message", "request_id"} and error["code"] == "BAD_REQUEST"
    assert api.http.get("/projects").status_code == 200


def test_malformed_bodies_on_every_route_with_one_are_4xx_and_the_server_stays(
    server: Server, api: Api
) -> None:
    """B5 on each create and update route: wrong types are not converted (``"17"`` is no 17,
    ``0`` no false), the deepest nesting is a 400 not a crash, and the same process serves on."""
    project = api.create_ready_project(name="malformed")
    pid, bid, eid = project["project"]["id"], project["branch"]["id"], project["endpoints"][0]["id"]
    branch = f"/projects/{pid}/branches/{bid}"
    assert server.process is not None
    process = server.process.pid
    before = _state(api)
    ops_before = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    nested = "[" * 10000 + "]" * 10000  # past any recursion limit
    bad: list[tuple[str, str, str]] = [
        ("POST", "/projects", '{"project": {"pg_version": "17"}}'),
        ("POST", "/projects", '{"project": {"store_passwords": 0}}'),
        ("POST", "/projects", '{"project": {"history_retention_seconds": "3600"}}'),
        ("POST", "/projects", '{"project": {"settings": ' + nested + "}}"),
        ("PATCH", f"/projects/{pid}", '{"project": {"history_retention_seconds": true}}'),
        ("PATCH", f"/projects/{pid}", '{"project": {"settings": {"a": ' + nested + "}}}"),
        ("POST", f"/projects/{pid}/branches", '{"branch": {"protected": "true"}}'),
        ("POST", f"/projects/{pid}/branches", '{"branch": {"name": "b"}, "x": ' + nested + "}"),
        ("PATCH", branch, '{"branch": {"protected": 1}}'),
        (
            "POST",
            f"/projects/{pid}/endpoints",
            '{"endpoint": {"branch_id": "' + bid + '", "type": 1}}',
        ),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", '{"endpoint": {"disabled": "false"}}'),
        (
            "PATCH",
            f"/projects/{pid}/endpoints/{eid}",
            '{"endpoint": {"suspend_timeout_seconds": "60"}}',
        ),
        ("POST", f"{branch}/roles", '{"role": {"name": "r", "no_login": "yes"}}'),
        ("POST", f"{branch}/databases", '{"database": {"name": 7, "owner_name": "neondb_owner"}}'),
        ("PATCH", f"{branch}/databases/neondb", '{"database": {"owner_name": ["neondb_owner"]}}'),
    ]
    json_type = {"Content-Type": "application/json"}
    for method, url, text in bad:
        r = api.http.request(method, url, content=text.encode(), headers=json_type)
        assert r.status_code == 400, (method, url, text[:80], r.text)
        _error(r, 400)
        for raw in (b"{", b"[]", b'{"a": 1, "a": 2}'):
            _error(api.http.request(method, url, content=raw, headers=json_type), 400)
        r = api.http.request(
            method, url, content=text.encode(), headers={"Content-Type": "text/plain"}
        )
        _error(r, 415)
    # No body where one is needed is a 400 that says so.
    r = api.http.post(f"{branch}/roles", headers=json_type)
    assert "body is required" in _error(r, 400)["message"]
    assert server.process.pid == process and server.process.poll() is None
    assert _state(api) == before
    after = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    assert after == ops_before

    # JSON Schema's integers, though: 600.0 is 600 (and 600.5 no integer).
    url = f"/projects/{pid}/endpoints/{eid}"
    _error(api.http.patch(url, json={"endpoint": {"suspend_timeout_seconds": 600.5}}), 400)
    r = api.http.patch(url, json={"endpoint": {"suspend_timeout_seconds": 600.0}})
    assert r.status_code == 200 and r.json()["endpoint"]["suspend_timeout_seconds"] == 600


HOSTILE_SEGMENTS = [
    "..%2F..%2F..%2Fetc",  # ../../../etc once decoded, as one path parameter
    "%2e%2e%2f%2e%2e%2f",
    "%252e%252e%252f",  # double-encoded
    "%2E%2E",
    "%2E",
    "%00",
    "a%00b",
    "%0Aline",
    "%FF%FE",  # not UTF-8
    "%F0%9F%90%98",  # an emoji
    "x" * 10240,
    "%2F",
    "~root",
    "C:%5Cwindows",
]
RAW_PATHS = [  # sent as they are: an HTTP client would resolve the dots itself
    "/api/v2/projects/../../../etc/passwd",
    "/api/v2/projects/{pid}/branches/../../../../../../etc",
    "/api/v2/projects/{pid}/branches/{bid}/databases/../../../../..",
    "/api/v2/../../../../etc/passwd",
]


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


# What may change in a data directory while requests are refused: the store, logs, runtime
# sockets, the pool of spare branch files (refilled in the background) and Postgres' own files.
# volumes/: a project's filesystem image changes as anything inside it does (its files are
# compared through projects/, where it is mounted).
_VOLATILE = ("pgplane.db", "serve.log", "logs/", "run/", "spare/", "volumes/")


def _kept(data_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        k: v
        for k, v in _tree(data_dir).items()
        if not k.startswith(_VOLATILE) and "/pgdata/" not in k and not k.endswith(".log")
    }


# A body each create and update route would take, so a hostile path id is what gets refused.
VALID_BODIES: dict[str, Any] = {
    "updateProject": {"project": {"name": "n"}},
    "createProjectBranch": {"branch": {"name": "n"}},
    "updateProjectBranch": {"branch": {"name": "n"}},
    "createProjectEndpoint": {
        "endpoint": {"branch_id": "br-none-none-00000000", "type": "read_write"}
    },
    "updateProjectEndpoint": {"endpoint": {"suspend_timeout_seconds": 600}},
    "createProjectBranchRole": {"role": {"name": "n"}},
    "createProjectBranchDatabase": {"database": {"name": "n", "owner_name": "neondb_owner"}},
    "updateProjectBranchDatabase": {"database": {"name": "n"}},
}


@pytest.fixture
def walled_server() -> Iterator[tuple[Server, Path]]:
    """A server whose data directory sits in a directory of its own, beside a canary tree."""
    outer = make_data_dir()
    data = outer / "data"
    data.mkdir()
    data.chmod(0o711)
    canary = outer / "canary" / "etc"
    canary.mkdir(parents=True)
    (canary / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    try:
        # Compute ports of its own: the session's server may hold a port for a suspended
        # compute that a second platform would see free and take.
        with running_server(data_dir=data, PGPLANE_COMPUTE_PORTS="22000-22099") as srv:
            yield srv, outer
    finally:
        shutil.rmtree(outer, ignore_errors=True)


def test_hostile_path_ids_stay_inside_the_data_directory(
    walled_server: tuple[Server, Path],
) -> None:
    """B4: every documented route with an id in its path, given traversal, NUL, non-UTF-8, emoji
    and 10 KB ids: 400 or 404 error bodies; nothing beside the data directory appears or changes,
    nothing in it but the store and the logs changes, and the server process is the same."""
    server, outer = walled_server
    _, key = server.create_key("walled@example.com")
    with Api(server, key) as api:
        project = api.create_ready_project(name="walled")
        pid, bid = project["project"]["id"], project["branch"]["id"]
        real = path_parameters(project, key_id="1")
        doc = httpx.get(f"{server.base_url}/openapi.json").json()
        outside = sorted(p.name for p in outer.iterdir())
        canary = _tree(outer / "canary")
        inside = _kept(server.data_dir)
        assert server.process is not None
        process = server.process.pid
        tried = 0
        for path, methods in doc["paths"].items():
            params = [p for p in real if "{" + p + "}" in path]
            for method, param in ((m, p) for m in methods for p in params):
                for segment in HOSTILE_SEGMENTS:
                    url = path
                    for name, value in real.items():
                        url = url.replace("{" + name + "}", segment if name == param else value)
                    r = api.http.request(
                        method.upper(),
                        httpx.URL(server.base_url.removesuffix("/api/v2") + url),
                        params={"database_name": "neondb", "role_name": "neondb_owner"},
                        json=VALID_BODIES.get(methods[method]["operationId"]),
                    )
                    tried += 1
                    # An encoded slash is decoded before routing, so such a path can name
                    # another route, one without this method: a 405 then.
                    allowed = (400, 404, 405) if "%2F" in segment.upper() else (400, 404)
                    assert r.status_code in allowed, (method, url[:200], r.text[:300])
                    _error(r, *allowed)
        assert tried > 400
        host, port = "127.0.0.1", server.port
        for raw in RAW_PATHS:
            for method in ("GET", "DELETE"):
                conn = http.client.HTTPConnection(host, port, timeout=30)
                conn.request(
                    method,
                    raw.format(pid=pid, bid=bid),
                    headers={"Authorization": f"Bearer {key}"},
                )
                answer = conn.getresponse()
                body = json.loads(answer.read())
                conn.close()
                assert answer.status == 404 and set(body) == {"code", "message", "request_id"}

        assert server.process.pid == process and server.process.poll() is None
        assert sorted(p.name for p in outer.iterdir()) == outside
        assert _tree(outer / "canary") == canary
        assert _kept(server.data_dir) == inside
        assert not [p for p in server.data_dir.rglob("*") if p.name == "etc" or "\x00" in str(p)]
        assert api.http.get(f"/projects/{pid}").status_code == 200
        assert os.path.exists(server.data_dir / "projects" / pid)


def test_quotas_refuse_with_422_and_change_nothing() -> None:
    """B3: past the account's project quota or the project's branch quota, a 422 with Neon's
    code for it; nothing is created, another account is unaffected, and freeing one makes room."""
    with (
        running_server(PGPLANE_PROJECTS_PER_ACCOUNT="2", PGPLANE_BRANCHES_PER_PROJECT="2") as srv,
        Api(srv, srv.create_key("acct-quota")[1]) as api,
        Api(srv, srv.create_key("acct-quota-other")[1]) as other,
    ):
        me = api.http.get("/users/me").json()
        assert (me["projects_limit"], me["branches_limit"]) == (2, 2)
        first = api.create_ready_project(name="q1")
        second = api.create_project(name="q2")
        assert first["project"]["owner"]["branches_limit"] == 2
        before = _state(api)
        r = api.http.post("/projects", json={"project": {"name": "q3"}})
        assert _error(r, 422)["code"] == "PROJECTS_LIMIT_EXCEEDED"
        assert "limit of 2 projects" in r.json()["message"]
        assert _state(api) == before
        other.create_project(name="theirs")  # a quota is per account

        pid = first["project"]["id"]
        api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))
        ops = api.http.get(f"/projects/{pid}/operations").json()["operations"]
        r = api.http.post(f"/projects/{pid}/branches", json={"endpoints": [{"type": "read_write"}]})
        assert _error(r, 422)["code"] == "BRANCHES_LIMIT_EXCEEDED"
        assert len(api.http.get(f"/projects/{pid}/branches").json()["branches"]) == 2
        assert api.http.get(f"/projects/{pid}/operations").json()["operations"] == ops

        second_id = second["project"]["id"]
        api.settled(second_id, api.http.delete(f"/projects/{second_id}"))
        api.create_project(name="q3")  # a deleted project no longer counts
