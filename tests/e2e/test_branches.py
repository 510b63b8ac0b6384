"""Branches over HTTP and the Postgres protocol: data isolation, online copies, the rules."""

from __future__ import annotations

import base64
import json
import threading
import time

import psycopg
import pytest

from tests.support import Api, wait_for

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores


def _ready_branch(api: Api, project_id: str, **body: object) -> dict:
    r = api.http.post(f"/projects/{project_id}/branches", json=body)
    assert r.status_code == 201, r.text
    created = dict(r.json())
    ops = api.wait_operations(project_id, [o["id"] for o in created["operations"]])
    assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
    return created


def _rows(uri: str) -> list[int]:
    with psycopg.connect(uri, connect_timeout=10) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v").fetchall()]


def test_each_side_keeps_its_own_writes(api: Api) -> None:
    project = api.create_ready_project(name="isolation")
    pid = project["project"]["id"]
    parent_uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(parent_uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
        conn.execute("INSERT INTO t SELECT generate_series(1, 3)")

    created = _ready_branch(api, pid, branch={"name": "dev"}, endpoints=[{"type": "read_write"}])
    assert [o["action"] for o in created["operations"]] == ["create_branch", "start_compute"]
    assert created["branch"]["parent_id"] == project["branch"]["id"]
    assert [r["name"] for r in created["roles"]] == ["neondb_owner"]
    assert created["roles"][0]["password"] == project["roles"][0]["password"]
    branch_uri = created["connection_uris"][0]["connection_uri"]
    assert branch_uri != parent_uri

    assert _rows(branch_uri) == [1, 2, 3]
    with psycopg.connect(parent_uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (100)")
    with psycopg.connect(branch_uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (200)")
    assert _rows(parent_uri) == [1, 2, 3, 100]
    assert _rows(branch_uri) == [1, 2, 3, 200]

    # A branch of the branch, from its head (the parent's compute keeps running throughout).
    grandchild = _ready_branch(
        api,
        pid,
        branch={"name": "dev-2", "parent_id": created["branch"]["id"]},
        endpoints=[{"type": "read_write"}],
    )
    assert _rows(grandchild["connection_uris"][0]["connection_uri"]) == [1, 2, 3, 200]
    branch = api.http.get(f"/projects/{pid}/branches/{created['branch']['id']}").json()["branch"]
    assert branch["current_state"] == "ready"


def test_branch_of_a_parent_under_steady_writes(api: Api) -> None:
    project = api.create_ready_project(name="busy")
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")

    stop = threading.Event()
    committed: list[float] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with psycopg.connect(uri, autocommit=True) as conn:
                i = 0
                while not stop.is_set():
                    i += 1
                    conn.execute("INSERT INTO t VALUES (%s)", (i,))
                    committed.append(time.monotonic())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_for("50 commits", lambda: len(committed) >= 50 or errors)
        started = time.monotonic()
        created = _ready_branch(api, pid, endpoints=[{"type": "read_write"}])
        finished = time.monotonic()
        wait_for("a commit after the copy", lambda: committed[-1] > finished or errors)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    # The parent kept committing while its copy was taken, and after.
    assert any(started < t < finished for t in committed)
    assert committed[-1] > finished

    branch_rows = _rows(created["connection_uris"][0]["connection_uri"])
    parent_rows = _rows(uri)
    # A consistent prefix of the parent's history: every row up to some point, nothing after.
    assert branch_rows == list(range(1, len(branch_rows) + 1))
    assert 50 <= len(branch_rows) < len(parent_rows)


def test_branch_without_compute_then_list_count_and_pages(api: Api) -> None:
    project = api.create_ready_project(name="pages")
    pid = project["project"]["id"]
    created = _ready_branch(api, pid, branch={"name": "no-compute"}, endpoints=[])
    assert created["endpoints"] == []
    assert "connection_uris" not in created
    _ready_branch(api, pid, branch={"name": "third"})
    r = api.http.post(f"/projects/{pid}/branches")  # no body at all: Neon's defaults
    assert r.status_code == 201, r.text
    api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])

    listed = api.http.get(f"/projects/{pid}/branches").json()
    assert listed["annotations"] == {}
    assert "pagination" not in listed
    assert len(listed["branches"]) == 4
    assert [b["default"] for b in listed["branches"]].count(True) == 1
    assert api.http.get(f"/projects/{pid}/branches/count").json() == {"count": 4}

    seen, cursor = [], None
    while True:
        params: dict[str, str | int] = {"limit": 1, "sort_by": "name", "sort_order": "asc"}
        if cursor:
            params["cursor"] = cursor
        page = api.http.get(f"/projects/{pid}/branches", params=params).json()
        seen += [b["name"] for b in page["branches"]]
        assert page["pagination"]["sort_order"] == "ASC"
        cursor = page["pagination"].get("next")
        if not cursor:
            break
    assert seen == sorted(b["name"] for b in listed["branches"])
    bad = base64.urlsafe_b64encode(json.dumps({"x": 1}).encode()).decode()
    for params in (
        {"limit": 1, "cursor": bad},
        {"limit": 1, "cursor": "garbage"},
        {"limit": 0},
        {"limit": -1},
        {"limit": 10001},
        {"limit": "abc"},
    ):
        r = api.http.get(f"/projects/{pid}/branches", params=params)
        assert r.status_code == 400 and set(r.json()) == {"code", "message", "request_id"}, params


def test_branch_rules(api: Api, other_api: Api) -> None:
    project = api.create_ready_project(name="rules")
    pid = project["project"]["id"]
    main = project["branch"]["id"]

    r = api.http.delete(f"/projects/{pid}/branches/{main}")
    assert r.status_code == 409 and "default" in r.json()["message"]

    child = _ready_branch(api, pid, branch={"name": "child"})["branch"]["id"]
    grandchild = _ready_branch(api, pid, branch={"name": "grandchild", "parent_id": child})
    r = api.http.delete(f"/projects/{pid}/branches/{child}")
    assert r.status_code == 409 and "child" in r.json()["message"]

    r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "child"}})
    assert r.status_code == 409 and "already exists" in r.json()["message"]
    for body in (
        {"branch": {"name": "x" * 257}},
        {"branch": {"parent_id": "br-missing-branch-00000000"}},
        {"branch": {"parent_lsn": "0/16B3748"}},
        {"endpoints": [{"type": "read_many"}]},
        {"endpoints": [{"type": "read_write"}, {"type": "read_write"}]},
    ):
        r = api.http.post(f"/projects/{pid}/branches", json=body)
        assert r.status_code in (400, 404, 409), (body, r.text)
    assert len(api.http.get(f"/projects/{pid}/branches").json()["branches"]) == 3

    r = api.http.patch(
        f"/projects/{pid}/branches/{child}", json={"branch": {"name": "renamed", "protected": True}}
    )
    assert r.status_code == 200, r.text
    assert r.json()["branch"]["name"] == "renamed" and r.json()["branch"]["protected"] is True
    assert r.json()["operations"] == []

    r = api.http.post(f"/projects/{pid}/branches/{child}/set_as_default")
    assert r.status_code == 200 and r.json()["branch"]["default"] is True
    r = api.http.get(f"/projects/{pid}/branches/{main}")
    assert r.json()["branch"]["default"] is False
    r = api.http.post(f"/projects/{pid}/branches/{main}/set_as_primary")
    assert r.status_code == 200 and r.json()["branch"]["primary"] is True

    gid = grandchild["branch"]["id"]
    r = api.http.delete(f"/projects/{pid}/branches/{gid}")
    assert r.status_code == 200, r.text
    assert [o["action"] for o in r.json()["operations"]] == ["delete_timeline"]
    ops = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert ops[0]["status"] == "finished", ops
    assert api.http.get(f"/projects/{pid}/branches/{gid}").status_code == 404
    r = api.http.delete(f"/projects/{pid}/branches/{gid}")
    assert r.status_code == 404

    # Another account sees none of it.
    assert other_api.http.get(f"/projects/{pid}/branches").status_code == 404
    assert other_api.http.get(f"/projects/{pid}/branches/{main}").status_code == 404
