"""Isolation between accounts, and between a project and its siblings (scenarios I1-I4; the
fields the platform owns and the routes outside its document, B2 and I5, are in
test_isolation_fields.py).

The matrix takes its routes from the server's own OpenAPI document, so a route added later is
tried too, and the test fails if a documented route was not exercised.
"""

from __future__ import annotations

import datetime
import itertools
import re
import secrets
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pgplane.core import ids
from tests.support import Api, Server, path_parameters

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores(postgresql="slow")

ID_PARAMS = ("project_id", "branch_id", "endpoint_id", "operation_id", "key_id", "snapshot_id")


def documented_routes(server: Server) -> set[tuple[str, str]]:
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    return {
        (method.upper(), path.removeprefix("/api/v2"))
        for path, item in doc["paths"].items()
        for method in item
        if method in ("get", "post", "put", "patch", "delete")
    }


def _path_params(path: str) -> list[str]:
    return re.findall(r"{(\w+)}", path)


def _fill(path: str, values: dict[str, Any]) -> str:
    return path.format(**{k: quote(str(v), safe="") for k, v in values.items()})


def _random_like(name: str) -> Any:
    """A value of the same shape as a real id that names nothing."""
    return {
        "project_id": ids.new_project_id,
        "branch_id": ids.new_branch_id,
        "endpoint_id": ids.new_endpoint_id,
        "operation_id": lambda: str(uuid.uuid4()),
        "snapshot_id": ids.new_snapshot_id,
        "key_id": lambda: 1_000_000_000 + secrets.randbelow(1_000_000_000),
        "role_name": lambda: f"nobody_{secrets.token_hex(4)}",
        "database_name": lambda: f"nodb_{secrets.token_hex(4)}",
    }[name]()


_RULE = {
    "database_name": "neondb",
    "schema_name": "public",
    "table_name": "t",
    "column_name": "c",
    "masking_value": "hijacked",
}


def _body(operation: str, values: dict[str, Any]) -> dict[str, Any] | None:
    """A body that would be accepted if the ids were the caller's (so a 404 is about ownership,
    not validation). A route with a body that is missing here fails the test, so a new route is
    never skipped silently."""
    bodies: dict[str, Callable[[], dict[str, Any]]] = {
        "updateProject": lambda: {"project": {"name": "hijacked"}},
        "createProjectBranch": lambda: {
            "branch": {"name": "hijack", "parent_id": values["branch_id"]}
        },
        "updateProjectBranch": lambda: {"branch": {"name": "hijacked", "protected": True}},
        "createProjectBranchAnonymized": lambda: {
            "branch_create": {"branch": {"name": "hijack", "parent_id": values["branch_id"]}},
            "masking_rules": [_RULE],
            "start_anonymization": True,
        },
        "updateMaskingRules": lambda: {"masking_rules": [_RULE]},
        "createProjectEndpoint": lambda: {
            "endpoint": {"branch_id": values["branch_id"], "type": "read_write"}
        },
        "updateProjectEndpoint": lambda: {"endpoint": {"suspend_timeout_seconds": 600}},
        "createProjectBranchRole": lambda: {"role": {"name": "hijacker"}},
        "createProjectBranchDatabase": lambda: {
            "database": {"name": "hijackdb", "owner_name": "neondb_owner"}
        },
        "updateProjectBranchDatabase": lambda: {"database": {"name": "hijacked"}},
        "updateSnapshot": lambda: {"snapshot": {"name": "hijacked"}},
        "restoreSnapshot": lambda: {
            "target_branch_id": values["branch_id"],
            "finalize_restore": True,
        },
        "finalizeRestoreBranch": lambda: {"name": "hijacked-old"},
        "setSnapshotSchedule": lambda: {"schedule": [{"frequency": "daily", "hour": 3}]},
        "restoreProjectBranch": lambda: {
            "source_branch_id": values["branch_id"],
            "source_timestamp": _a_second_ago(),
            "preserve_under_name": "hijacked-old",
        },
    }
    make = bodies.get(operation)
    return make() if make else None


def _a_second_ago() -> str:
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    return moment.isoformat()


def _query(operation: str, values: dict[str, Any]) -> dict[str, Any]:
    if operation == "getConnectionURI":
        return {
            "database_name": "neondb",
            "role_name": "neondb_owner",
            "branch_id": values["branch_id"],
            "endpoint_id": values["endpoint_id"],
        }
    return {}


# Ids a route takes from its body or query rather than its path.
REFERENCES = {
    "createProjectBranch": {"branch_id"},
    "createProjectBranchAnonymized": {"branch_id"},
    "createProjectEndpoint": {"branch_id"},
    "getConnectionURI": {"branch_id", "endpoint_id"},
    "restoreProjectBranch": {"branch_id"},
    "restoreSnapshot": {"branch_id"},
}


@dataclass
class Target:
    """Path values to try, and which of them are not the caller's to touch."""

    name: str
    values: dict[str, Any]
    foreign: set[str]

    def reference(self) -> dict[str, Any]:
        """The same values with every foreign one replaced by one that names nothing."""
        return {k: _random_like(k) if k in self.foreign else v for k, v in self.values.items()}


@dataclass
class World:
    """Account A with projects P1 and P2, account B with one project, and the ids of each."""

    a: Api
    b: Api
    pb: dict[str, Any]  # B's project as created
    b_ids: dict[str, Any]  # path values naming B's objects
    p1_ids: dict[str, Any]  # A's project the wrong-parent paths go through
    p2_ids: dict[str, Any]  # A's other project, whose children are tried under P1
    b_account: str
    b_email: str
    b_key_ids: list[int]
    b_second_key: str


@pytest.fixture
def world(api: Api, other_api: Api) -> World:
    # Computes never suspend on their own here, so nothing but a request could change them.
    never = {"default_endpoint_settings": {"suspend_timeout_seconds": -1}}
    p1 = api.create_ready_project(name="a-one", **never)
    p2 = api.create_ready_project(name="a-two", **never)
    pb = other_api.create_ready_project(name="b-only", **never)
    pid, bid = pb["project"]["id"], pb["branch"]["id"]
    base = f"/projects/{pid}/branches/{bid}"
    # A role and a database whose names exist in B alone.
    other_api.settled(pid, other_api.http.post(f"{base}/roles", json={"role": {"name": "b_role"}}))
    other_api.settled(
        pid,
        other_api.http.post(
            f"{base}/databases", json={"database": {"name": "b_db", "owner_name": "b_role"}}
        ),
    )
    second = other_api.http.post("/api_keys", json={"key_name": "b-second"}).json()
    snaps = {
        body["project"]["id"]: owner.settled(
            body["project"]["id"],
            owner.http.post(
                f"/projects/{body['project']['id']}/branches/{body['branch']['id']}/snapshot"
            ),
        )["snapshot"]["id"]
        for owner, body in ((api, p1), (api, p2), (other_api, pb))
    }
    me = other_api.http.get("/users/me").json()
    return World(
        a=api,
        b=other_api,
        pb=pb,
        b_ids=path_parameters(
            pb, key_id=second["id"], role="b_role", database="b_db", snapshot_id=snaps[pid]
        ),
        p1_ids=path_parameters(p1, key_id=0, snapshot_id=snaps[p1["project"]["id"]]),
        p2_ids=path_parameters(p2, key_id=0, snapshot_id=snaps[p2["project"]["id"]]),
        b_account=me["id"],
        b_email=me["email"],
        b_key_ids=[k["id"] for k in other_api.http.get("/api_keys").json()],
        b_second_key=second["key"],
    )


def _targets(w: World) -> Iterator[Target]:
    children = {"branch_id", "endpoint_id", "operation_id", "snapshot_id"}
    # I1/I2: every id is B's.
    yield Target("B's objects", w.b_ids, set(w.b_ids))
    # B's children under A's own project: a child is looked up in its path's parent only.
    yield Target(
        "B's children under A's project",
        {**w.b_ids, "project_id": w.p1_ids["project_id"], "role_name": "neondb_owner",
         "database_name": "neondb"},
        children,
    )  # fmt: skip
    # I3: A's children of P2 under P1.
    yield Target(
        "P2's children under P1", {**w.p2_ids, "project_id": w.p1_ids["project_id"]}, children
    )


def _comparable(r: httpx.Response) -> tuple[int, str, Any]:
    body = r.json()
    body.pop("request_id", None)
    return r.status_code, r.headers.get("content-type", ""), body


# What changes by itself while nobody touches an object: a key's use (its own reads), the usage
# figures the platform samples, an error body's request id.
_LIVE = frozenset(
    {
        "last_used_at",
        "last_used_from_addr",
        "request_id",
        "cpu_used_sec",
        "compute_time_seconds",
        "active_time_seconds",
        "active_time",
        "data_storage_bytes_hour",
        "written_data_bytes",
        "synthetic_storage_size",
        "logical_size",
        "on_disk_bytes",
        "history_bytes",
        "consumption_period_start",
        "consumption_period_end",
    }
)


def _still(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: _still(v) for k, v in body.items() if k not in _LIVE}
    if isinstance(body, list):
        return [_still(v) for v in body]
    return body


def _snapshot(api: Api, urls: list[str]) -> dict[str, Any]:
    """What the owner sees on every GET, less what changes by itself (:data:`_LIVE`)."""
    seen: dict[str, Any] = {}
    for url in urls:
        r = api.http.get(url)
        seen[url] = (r.status_code, _still(r.json()))
    return seen


def _get_urls(routes: set[tuple[str, str]], values: dict[str, Any], scoped: bool) -> list[str]:
    urls = []
    for method, path in sorted(routes):
        params = _path_params(path)
        if method != "GET" or (scoped and "project_id" not in params):
            continue
        url = _fill(path, values)
        if path.endswith("/connection_uri"):
            url += "?database_name=neondb&role_name=neondb_owner"
        if path.endswith("/operations"):
            url += "?limit=1000"  # all of them: no operation may appear
        if path.endswith("/schema"):
            url += "?db_name=neondb"
        if path.endswith("/compare_schema"):  # the branch against itself: an empty diff
            url += f"?db_name=neondb&base_branch_id={values['branch_id']}"
        urls.append(url)
    return urls


def _postmaster_pid(server: Server, ids: dict[str, Any]) -> int:
    branch = server.data_dir / "projects" / ids["project_id"] / "branches" / ids["branch_id"]
    return int((branch / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


def test_account_a_cannot_reach_b_or_cross_project_parents(server: Server, world: World) -> None:
    """I1-I3: every documented route, on every object of B and on A's objects under the wrong
    parent, is the same 404 as for an id that names nothing; nothing of B or of A's projects
    changes, no operation is created, B's compute keeps running as the same process."""
    w = world
    routes = documented_routes(server)
    doc = httpx.get(f"{server.base_url}/openapi.json").json()
    operation_of = {
        (m.upper(), p.removeprefix("/api/v2")): item["operationId"]
        for p, methods in doc["paths"].items()
        for m, item in methods.items()
    }
    takes_body = {
        item["operationId"]
        for methods in doc["paths"].values()
        for item in methods.values()
        if "requestBody" in item
    }
    b_urls = _get_urls(routes, w.b_ids, scoped=False)
    a_urls = _get_urls(routes, w.p1_ids, scoped=True) + _get_urls(routes, w.p2_ids, scoped=True)
    b_before, a_before = _snapshot(w.b, b_urls), _snapshot(w.a, a_urls)
    pid_before = _postmaster_pid(server, w.b_ids)

    exercised: set[tuple[str, str]] = set()
    failures: list[str] = []
    for target, (method, path) in itertools.product(list(_targets(w)), sorted(routes)):
        operation = operation_of[(method, path)]
        used = set(_path_params(path)) | REFERENCES.get(operation, set())
        if not used & set(ID_PARAMS) & target.foreign:
            continue  # nothing foreign in this request: the account-scoped checks cover it
        if operation in takes_body and _body(operation, target.values) is None:
            failures.append(f"no body for {operation}: add one to _body")
            continue
        responses = [
            w.a.http.request(
                method,
                _fill(path, values),
                params=_query(operation, values),
                json=_body(operation, values),
            )
            for values in (target.values, target.reference())
        ]
        exercised.add((method, path))
        foreign, missing = (_comparable(r) for r in responses)
        if foreign[0] != 404 or foreign != missing:
            failures.append(
                f"{target.name}: {method} {path} -> {foreign} but for nothing -> {missing}"
            )
    assert not failures, "\n".join(failures)

    # Routes with no id in their path act on the caller's account only: nothing of B shows.
    b_marks = [w.b_account, w.b_email, *(v for k, v in w.b_ids.items() if k != "key_id")]
    for method, path in sorted(routes):
        if _path_params(path):
            continue
        body = {
            "createProject": {"project": {"name": "a-three", "owner_id": w.b_account}},
            "createApiKey": {"key_name": "a-key", "account_id": w.b_account},
        }.get(operation_of[(method, path)])
        # The consumption history needs a range; asked about B's project by its id, it shows
        # it as one that does not exist: not at all.
        hour = datetime.datetime.now(datetime.UTC).replace(minute=0, second=0, microsecond=0)
        frame = {
            "granularity": "hourly",
            "from": (hour - datetime.timedelta(hours=2)).isoformat(),
            "to": (hour + datetime.timedelta(hours=1)).isoformat(),
        }
        params = {
            "getConsumptionHistoryPerProjectV2": {**frame, "metrics": "compute_unit_seconds"},
            "getConsumptionHistoryPerProject": frame,
            "getConsumptionHistoryPerBranchV2": {
                **frame,
                "metrics": "root_branch_bytes_month",
                "project_ids": w.b_ids["project_id"],
            },
        }.get(operation_of[(method, path)])
        r = w.a.http.request(method, path, json=body, params=params)
        exercised.add((method, path))
        assert r.status_code in (200, 201), (method, path, r.text)
        leaked = [mark for mark in b_marks if str(mark) in r.text]
        assert not leaked, (method, path, leaked)
        if path == "/api_keys" and method == "GET":
            assert not {k["id"] for k in r.json()} & set(w.b_key_ids)
        if path == "/projects" and method == "POST":
            made = r.json()
            w.a.wait_operations(made["project"]["id"], [o["id"] for o in made["operations"]])

    assert routes - exercised == set(), f"routes the matrix did not try: {routes - exercised}"

    # B and A's projects are as they were; no operation was created for them.
    assert _snapshot(w.b, b_urls) == b_before
    assert _snapshot(w.a, a_urls) == a_before
    assert _postmaster_pid(server, w.b_ids) == pid_before
    with psycopg.connect(w.pb["connection_uris"][0]["connection_uri"], connect_timeout=10) as conn:
        assert conn.execute("SELECT current_database()").fetchone() == ("neondb",)
    with Api(server, w.b_second_key) as b_second:  # A's revoke of B's key id did nothing
        assert b_second.http.get("/projects").status_code == 200


def test_one_accounts_database_password_opens_nothing_of_anothers(api: Api, other_api: Api) -> None:
    """I6(a): both projects have a role named neondb_owner; B's password for it, sent to A's
    endpoint through the proxy, fails Postgres' authentication there, and A's stays A's."""
    a = api.create_ready_project(name="data-plane-a")["connection_uris"][0]["connection_uri"]
    b = other_api.create_ready_project(name="data-plane-b")["connection_uris"][0]["connection_uri"]
    a_params, b_params = conninfo_to_dict(a), conninfo_to_dict(b)
    assert a_params["user"] == b_params["user"] == "neondb_owner"
    a_with_b_password = make_conninfo(a, password=str(b_params["password"]), connect_timeout=10)
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(a_with_b_password).close()
    with psycopg.connect(a) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("neondb_owner",)


def _page_all(api: Api, url: str, key: str, limit: int) -> list[str]:
    """Every item's id, following ``pagination.cursor`` until an empty page."""
    seen: list[str] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        page = api.http.get(url, params=params)
        assert page.status_code == 200, page.text
        items = page.json()[key]
        assert len(items) <= limit
        if not items:
            return seen
        seen += [item["id"] for item in items]
        cursor = page.json()["pagination"]["cursor"]


def test_lists_and_pages_hold_only_the_callers_objects(api: Api, other_api: Api) -> None:
    """I4: paging through projects and operations yields exactly the caller's, once each; a
    cursor naming another account's project is the same 400 as one that names nothing."""
    mine = [api.create_project(name=f"a-{i}")["project"]["id"] for i in range(12)]
    theirs_made = [other_api.create_project(name=f"b-{i}") for i in range(12)]
    theirs = [m["project"]["id"] for m in theirs_made]

    for limit in (1, 5, 12, 400):
        seen = _page_all(api, "/projects", "projects", limit)
        assert sorted(seen) == sorted(mine) and len(seen) == len(set(seen)), limit
        seen = _page_all(other_api, "/projects", "projects", limit)
        assert sorted(seen) == sorted(theirs) and len(seen) == len(set(seen)), limit

    foreign = api.http.get("/projects", params={"cursor": theirs[0]})
    nothing = api.http.get("/projects", params={"cursor": ids.new_project_id()})
    assert foreign.status_code == 400
    assert _comparable(foreign) == _comparable(nothing)

    # Every operation of a project, page by page: its own, each once, none of B's.
    their_ops = {o["id"] for m in theirs_made for o in m["operations"]}
    for pid in mine[:3]:
        ops_url = f"/projects/{pid}/operations"
        everything = api.http.get(ops_url, params={"limit": 1000}).json()["operations"]
        assert {o["project_id"] for o in everything} == {pid}
        for limit in (1, 2, 10):
            seen = _page_all(api, ops_url, "operations", limit)
            assert seen == [o["id"] for o in everything], limit
            assert not set(seen) & their_ops
    for made in theirs_made:
        other_api.wait_operations(made["project"]["id"], [o["id"] for o in made["operations"]])
    for pid in mine:
        ops = api.http.get(f"/projects/{pid}/operations").json()["operations"]
        api.wait_operations(pid, [o["id"] for o in ops])


def test_a_restore_takes_no_source_but_its_own_projects(server: Server, world: World) -> None:
    """A's own branch restored from B's branch, or from a branch of A's other project: the same
    404 as from a branch that does not exist, and no operation."""
    w = world
    pid = w.p1_ids["project_id"]
    url = f"/projects/{pid}/branches/{w.p1_ids['branch_id']}/restore"
    before = len(w.a.operations(pid))

    def restore(source: str) -> tuple[int, str, Any]:
        return _comparable(w.a.http.post(url, json={"source_branch_id": source}))

    missing = restore("br-nothing-here-00000000")
    assert missing[0] == 404, missing
    assert restore(w.b_ids["branch_id"]) == missing
    assert restore(w.p2_ids["branch_id"]) == missing
    assert len(w.a.operations(pid)) == before
