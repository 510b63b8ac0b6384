"""Fields the platform owns, and routes outside its document (scenarios B2, I5): ids, owners,
statuses and timestamps a caller sends are ignored (a branch's or a compute's body refuses them
with a 400 naming the field: those bodies take only their own), and no path the document lacks
is served."""

from __future__ import annotations

import asyncio
import copy
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.e2e.test_isolation import documented_routes
from tests.support import Api, Server

# Actions only the platform starts (scheduler, proxy, reconciliation); no request may create one.
PLATFORM_ONLY_ACTIONS = {"tenant_detach", "tenant_reattach", "tenant_attach", "check_availability"}


HOSTILE_FIELDS = {
    "id": "my-own-id",
    "project_id": "my-own-project",
    "owner_id": "someone-else",
    "account_id": "someone-else",
    "action": "tenant_detach",
    "status": "finished",
    "operations": [{"action": "tenant_detach", "status": "finished"}],
    "created_at": "2000-01-01T00:00:00Z",
    "updated_at": "2000-01-01T00:00:00Z",
    "locked": True,
    "deleted_at": "2000-01-01T00:00:00Z",
    "quota": {"compute": 1e9},
    "provisioner": "k8s-neonvm",
    "current_state": "idle",
    "password": "chosen-by-caller",
    "key": "pgp_" + "A" * 60,
    "protected": True,
    "default": True,
}


def _with_hostile(body: dict[str, Any], wrapper: str | None, keep: set[str]) -> dict[str, Any]:
    hostile = {k: v for k, v in HOSTILE_FIELDS.items() if k not in keep}
    out = copy.deepcopy(body)
    if wrapper is None:
        return {**hostile, **out}
    out[wrapper] = {**hostile, **out[wrapper]}
    return {**hostile, **out}


def test_fields_the_platform_owns_are_ignored(api: Api, other_api: Api) -> None:
    """B2 and I5: ids, owners, statuses, actions and timestamps in create and update bodies are
    ignored; no request creates a platform-only operation or one that is already finished."""
    b_account = other_api.http.get("/auth").json()["account_id"]
    hostile = dict(HOSTILE_FIELDS, owner_id=b_account, account_id=b_account)
    r = api.http.post(
        "/projects",
        json={"project": {**hostile, "name": "mass"}, "action": "tenant_detach"},
    )
    assert r.status_code == 201, r.text
    made = r.json()
    project = made["project"]
    pid = project["id"]
    assert pid != "my-own-id" and re.fullmatch(r"[a-z0-9-]{1,60}", pid)
    assert project["owner_id"] != b_account and project["created_at"] > "2020"
    assert project["provisioner"] != "k8s-neonvm" and project["locked"] is True
    assert {o["action"] for o in made["operations"]} == {"create_timeline", "start_compute"}
    assert "finished" not in {o["status"] for o in made["operations"]}
    assert other_api.http.get(f"/projects/{pid}").status_code == 404
    assert pid not in other_api.http.get("/projects").text
    password = made["roles"][0]["password"]
    assert password != "chosen-by-caller"
    api.wait_operations(pid, [o["id"] for o in made["operations"]])
    bid, eid = made["branch"]["id"], made["endpoints"][0]["id"]
    branch_path = f"/projects/{pid}/branches/{bid}"

    calls: list[tuple[str, str, dict[str, Any]]] = [
        ("PATCH", f"/projects/{pid}", _with_hostile({"project": {"name": "m2"}}, "project", set())),
        ("POST", f"{branch_path}/roles", _with_hostile({"role": {"name": "m5"}}, "role", set())),
        (
            "POST",
            f"{branch_path}/databases",
            _with_hostile(
                {"database": {"name": "m6", "owner_name": "neondb_owner"}}, "database", set()
            ),
        ),
        ("POST", "/api_keys", _with_hostile({"key_name": "m7"}, None, set())),
    ]
    for method, url, body in calls:
        r = api.http.request(method, url, json=body)
        assert r.status_code in (200, 201), (method, url, r.text)
        answer = r.json()
        assert "my-own-id" not in r.text and "my-own-project" not in r.text, (url, r.text)
        assert "2000-01-01" not in r.text, (url, r.text)
        for op in answer.get("operations", []) if isinstance(answer, dict) else []:
            assert op["action"] not in PLATFORM_ONLY_ACTIONS, (url, op)
            assert op["status"] != "finished", (url, op)
        if url == "/api_keys":
            assert answer["key"] != HOSTILE_FIELDS["key"]
            with Api(api.server, answer["key"]) as fresh:
                assert fresh.http.get("/auth").json()["account_id"] != b_account
        if url.endswith("/roles"):
            assert answer["role"]["password"] != "chosen-by-caller"
            assert answer["role"]["protected"] is False

    got = api.http.get(f"/projects/{pid}").json()["project"]
    assert (got["id"], got["name"], got["owner_id"]) == (pid, "m2", project["owner_id"])
    assert got["created_at"] == project["created_at"]
    branch = api.http.get(branch_path).json()["branch"]
    assert (branch["id"], branch["project_id"], branch["protected"]) == (bid, pid, False)
    endpoint = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert (endpoint["id"], endpoint["project_id"]) == (eid, pid)
    ops = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    assert not {o["action"] for o in ops["operations"]} & PLATFORM_ONLY_ACTIONS
    api.wait_operations(pid, [o["id"] for o in ops["operations"]])


def test_a_branch_or_compute_body_refuses_fields_it_does_not_take(api: Api) -> None:
    """A branch's and a compute's bodies take only their own fields: any other (the platform's,
    or one of Neon's this platform does not serve) is a 400 naming it, and nothing changes."""
    made = api.create_project(name="strict")
    pid, bid = made["project"]["id"], made["branch"]["id"]
    eid = made["endpoints"][0]["id"]
    branch_path = f"/projects/{pid}/branches/{bid}"
    refused: list[tuple[str, str, dict[str, Any], str]] = [
        (
            "PATCH",
            branch_path,
            _with_hostile({"branch": {"name": "m3"}}, "branch", {"protected"}),
            "unknown field",
        ),
        (
            "POST",
            f"/projects/{pid}/branches",
            _with_hostile({"branch": {"name": "m4"}}, "branch", {"protected"}),
            "unknown field",
        ),
        (
            "PATCH",
            f"/projects/{pid}/endpoints/{eid}",
            _with_hostile({"endpoint": {"suspend_timeout_seconds": 600}}, "endpoint", set()),
            "unknown field",
        ),
        (
            "POST",
            f"/projects/{pid}/branches",
            {"branch": {"name": "m5"}, "endpoints": [{"type": "read_write", "cu": 1}]},
            "unknown field `cu`",
        ),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", {"endpoint": {"pooler_enabled": True}},
         "endpoint.pooler_enabled"),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", {"endpoint": {"passwordless_access": True}},
         "endpoint.passwordless_access"),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", {"endpoint": {"name": "x" * 65}},
         "endpoint.name"),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", {"endpoint": {"pooler_mode": "session"}},
         "endpoint.pooler_mode"),
        ("PATCH", f"/projects/{pid}/endpoints/{eid}", {"endpoint": {"provisioner": "k8s-qemu"}},
         "endpoint.provisioner"),
    ]  # fmt: skip
    for method, url, body, named in refused:
        r = api.http.request(method, url, json=body)
        assert r.status_code == 400, (method, url, r.text)
        assert named in r.json()["message"], (url, r.text)
    # What the platform is, said back, is taken: Neon's clients send these defaults.
    same = {"pooler_enabled": False, "passwordless_access": False, "pooler_mode": "transaction",
            "provisioner": "k8s-pod"}  # fmt: skip
    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": same})
    assert r.status_code == 200, r.text
    # Neon's MCP server asks for its autoscaled VMs: the one kind of compute here, as they are.
    neonvm = {"endpoint": {"provisioner": "k8s-neonvm"}}
    r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json=neonvm)
    assert r.status_code == 200 and r.json()["endpoint"]["provisioner"] == "k8s-pod", r.text
    branch = api.http.get(branch_path).json()["branch"]
    assert branch["name"] == made["branch"]["name"] and branch["protected"] is False
    listed = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert [b["id"] for b in listed] == [bid]
    endpoint = api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]
    assert endpoint["suspend_timeout_seconds"] == made["endpoints"][0]["suspend_timeout_seconds"]
    assert endpoint["pooler_enabled"] is False and endpoint["passwordless_access"] is False


async def _never_called(*, pg_version: int, settings: Mapping[str, str]) -> None:
    raise AssertionError("this app only lists its routes")


def test_routes_outside_the_document_do_not_exist(server: Server, api: Api, tmp_path: Path) -> None:
    """I5: admin-like and platform paths are 404 (with the error body), methods a documented path
    lacks are 405 with ``Allow``, OPTIONS tells the documented ones, and the app serves no route
    its document does not list."""
    project = api.create_project(name="unknown-routes")
    pid = project["project"]["id"]
    for path in (
        "/admin",
        "/internal/operations",
        "/projects/{pid}/detach",
        "/projects/{pid}/tenant_detach",
        "/projects/{pid}/operations/run/now",
        "/accounts",
        "/api_keys/1/restore",
        "/../v1/projects",
        "/projects/{pid}/branches/x/y/z/w",
    ):
        for method in ("GET", "POST", "DELETE"):
            r = api.http.request(method, path.format(pid=pid), json={})
            assert r.status_code == 404, (method, path, r.text)
            assert set(r.json()) == {"code", "message", "request_id"}
            # Neon's words for a route it does not serve: its clients read them as a feature
            # not available here.
            assert "this route does not exist" in r.json()["message"], r.text
    for method, path in (
        ("PATCH", "/api_keys/1"),
        ("PUT", "/projects"),
        ("POST", f"/projects/{pid}/operations"),
        ("DELETE", f"/projects/{pid}/operations/{uuid.uuid4()}"),
    ):
        r = api.http.request(method, path, json={})
        assert r.status_code == 405, (method, path, r.text)
        assert r.headers["allow"] and r.json()["code"] == "METHOD_NOT_ALLOWED"

    # OPTIONS on each documented path lists exactly its documented methods.
    routes = documented_routes(server)
    for path in {p for _, p in routes}:
        url = path.replace("{key_id}", "1")
        url = re.sub(r"{\w+}", "x", url)
        r = api.http.options(url)
        assert r.status_code == 204, (path, r.text)
        allowed = {m.strip() for m in r.headers["allow"].split(",")}
        assert allowed == {m for m, p in routes if p == path} | {"OPTIONS"}, (path, allowed)

    # Every route the application serves is in its document (bar the document and its viewer,
    # the health probes, which are outside /api/v2 and tell nothing of any account, and the web
    # console's pages, behind its own sessions: test_console.py holds them to the same walls).
    from pgplane.api.app import create_app
    from pgplane.config import Settings
    from pgplane.store.sqlite import SqliteStore

    store = SqliteStore(tmp_path / "routes.db")
    try:
        # Built here, under pytest's warnings-as-errors: Litestar deprecates nothing we use.
        app = create_app(
            store=store, settings=Settings(data_dir=tmp_path), check_settings=_never_called
        )
        served = {
            (method, route.path.removeprefix("/api/v2"))
            for route in app.routes
            for method in getattr(route, "methods", ())
            if method not in ("OPTIONS", "HEAD")
        }
    finally:
        asyncio.run(store.close())
    served = {(m, re.sub(r"{(\w+):\w+}", r"{\1}", p)) for m, p in served}
    outside = {("GET", "/openapi.json"), ("GET", "/livez"), ("GET", "/readyz")}
    console = {(m, p) for m, p in served if p == "/" or p.startswith("/console")}
    # The reference page and Litestar's own copy of the document (the served one is ours).
    undocumented = {(m, p) for m, p in served if not p.startswith(("/docs", "/schema"))}
    undocumented -= outside | routes
    undocumented -= console
    assert undocumented == set()
    api.wait_operations(pid, [o["id"] for o in project["operations"]])
