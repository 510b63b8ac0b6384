"""Requests that race: queued work runs in order, one name has one owner, pages stay exact.

DESIGN §2: work on a busy project is queued (``scheduling``) in creation order, not refused;
operations whose branches or computes overlap run one after another. Unique names are the
store's (a unique index), so of several requests for one name exactly one wins and the others
get a 409 whose ``code`` says which name was taken. The operations list pages by a timestamp
cursor that stays exact while operations are created.

Requests are sent together from threads released by one barrier, each on its own connection, so
the server has them all in hand at once.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from pgplane.core import clock
from tests.crash import assert_consistent
from tests.stores import open_server_store, server_store
from tests.support import Api, Server, finished_operation, running_server

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

Call = tuple[str, str, dict[str, Any] | None]


def at_once(api: Api, calls: list[Call]) -> list[httpx.Response]:
    """Send the calls together, each from its own thread and connection; answers in call order."""
    barrier = threading.Barrier(len(calls))

    def send(call: Call) -> httpx.Response:
        method, path, body = call
        with httpx.Client(
            base_url=api.server.base_url,
            headers={"Authorization": f"Bearer {api.key}"},
            timeout=60,
        ) as http:
            http.get("/projects", params={"limit": 1})  # connected before the start signal
            barrier.wait()
            return http.request(method, path, json=body)

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(send, calls))


def _us(stamp: str) -> int:
    return clock.parse_us(stamp)


def _operations(api: Api, pid: str, op_ids: list[str]) -> list[dict[str, Any]]:
    """These operations as the project's list shows them now, oldest first."""
    listed = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    wanted = set(op_ids)
    return sorted(
        (o for o in listed["operations"] if o["id"] in wanted), key=lambda o: _us(o["created_at"])
    )


def assert_queue_order(ops: list[dict[str, Any]]) -> None:
    """Operations that must run one at a time, oldest first: finished ones, at most one running,
    then the waiting ones. Any other picture means one ran out of turn."""
    rank = {"finished": 0, "running": 1, "scheduling": 2}
    statuses = [o["status"] for o in ops]
    assert statuses == sorted(statuses, key=rank.__getitem__), statuses
    assert statuses.count("running") <= 1, statuses


def assert_one_after_another(ops: list[dict[str, Any]]) -> None:
    """Settled operations, oldest first: each started after the one before had finished.

    An attempt starts ``total_duration_ms`` before the operation's last update (its finish), at
    the latest: the duration is rounded down.
    """
    for earlier, later in itertools.pairwise(ops):
        started = _us(later["updated_at"]) - later["total_duration_ms"] * 1000
        assert started >= _us(earlier["updated_at"]), (earlier, later)


def _locked(api: Api, pid: str) -> bool:
    return bool(api.http.get(f"/projects/{pid}").json()["project"]["locked"])


# -- C1: queued in order, none lost, none doubled ----------------------------------------------

# The first compute start and the first branch copy each pause 3 s: long enough for the requests
# a test sends meanwhile to find them still running.
PAUSES = "before:start_compute=1*sleep(3000),create_branch:copied=1*sleep(3000)"


def test_work_asked_of_a_busy_project_is_queued_and_runs_in_order(store_backend: str) -> None:
    with (
        running_server(store=server_store(store_backend), PGPLANE_FAILPOINTS=PAUSES) as server,
        Api(server, server.create_key("queue@example.com")[1]) as api,
    ):
        pid = _roles_and_databases_wait_for_the_compute_start(server, api)
        _ten_branches_at_once_are_all_made_one_after_another(server, api, pid)
        assert_consistent(server, api, pid)  # one data directory per branch, nothing half-made


def _roles_and_databases_wait_for_the_compute_start(server: Server, api: Api) -> str:
    """Pinned: a database or role asked for while the compute starts is not refused (no 423),
    nor applied beside the start: it is queued behind it, and they run in creation order."""
    body = api.create_project(name="queue")
    pid, bid = body["project"]["id"], body["branch"]["id"]
    start = body["operations"][-1]
    assert start["action"] == "start_compute"
    server.wait_for_log("failpoint before:start_compute reached")

    branch = f"/projects/{pid}/branches/{bid}"
    database = api.http.post(
        f"{branch}/databases",
        json={"database": {"name": "queued_db", "owner_name": "neondb_owner"}},
    )
    role = api.http.post(f"{branch}/roles", json={"role": {"name": "queued_role"}})
    assert (database.status_code, role.status_code) == (201, 201), (database.text, role.text)
    applies = [database.json()["operations"][0], role.json()["operations"][0]]
    assert [(o["action"], o["status"]) for o in applies] == [("apply_config", "scheduling")] * 2
    assert _locked(api, pid)

    op_ids = [start["id"], *(o["id"] for o in applies)]
    settled = api.wait_operations(pid, op_ids)
    assert [o["status"] for o in settled] == ["finished"] * 3, settled
    assert_one_after_another(_operations(api, pid, op_ids))
    with psycopg.connect(body["connection_uris"][0]["connection_uri"]) as conn:
        assert conn.execute(
            "SELECT (SELECT count(*) FROM pg_database WHERE datname = 'queued_db'),"
            " (SELECT count(*) FROM pg_roles WHERE rolname = 'queued_role')"
        ).fetchone() == (1, 1)
    return str(pid)


def _ten_branches_at_once_are_all_made_one_after_another(
    server: Server, api: Api, pid: str
) -> None:
    """All accepted, each copy after the one before (they all copy one parent), none lost, none
    made twice."""
    names = [f"q-{i}" for i in range(10)]
    responses = at_once(
        api, [("POST", f"/projects/{pid}/branches", {"branch": {"name": n}}) for n in names]
    )
    assert [r.status_code for r in responses] == [201] * 10, [r.text for r in responses]
    op_ids = []
    for r in responses:
        (op,) = r.json()["operations"]
        assert op["action"] == "create_branch"
        op_ids.append(op["id"])
    assert len(set(op_ids)) == 10

    # The first copy is paused: it runs, the nine others wait their turn, the project says so.
    first_look = _operations(api, pid, op_ids)
    assert [o["status"] for o in first_look] == ["running"] + ["scheduling"] * 9, first_look
    assert _locked(api, pid)
    deadline = time.monotonic() + 120
    while True:
        ops = _operations(api, pid, op_ids)
        assert_queue_order(ops)
        if all(o["status"] in ("finished", "failed") for o in ops):
            break
        assert time.monotonic() < deadline, ops
        time.sleep(0.05)
    assert [(o["status"], o["failures_count"]) for o in ops] == [("finished", 0)] * 10
    assert_one_after_another(ops)
    assert server.log().count("failpoint create_branch:copied reached") == 1

    branches = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert sorted(b["name"] for b in branches) == sorted(["main", *names])
    assert not _locked(api, pid)


# -- C2: one name, one winner ------------------------------------------------------------------


def _one_winner(responses: list[httpx.Response], code: str) -> dict[str, Any]:
    """Exactly one created; every other answer a 409 naming what was taken. The winner's body."""
    created = [r for r in responses if r.status_code == 201]
    refused = [r for r in responses if r.status_code != 201]
    assert len(created) == 1, [r.text for r in responses]
    for r in refused:
        assert r.status_code == 409, r.text
        error = r.json()
        assert error["code"] == code, error
        assert "already exists" in error["message"], error
    return dict(created[0].json())


def test_one_name_asked_for_by_many_at_once_is_given_once(api: Api) -> None:
    body = api.create_ready_project(name="races")
    pid, main = body["project"]["id"], body["branch"]["id"]
    project = f"/projects/{pid}"
    branch = f"{project}/branches/{main}"
    op_ids: list[str] = []

    for name, racers in (("pr-1", 2), ("pr-2", 10)):
        won = _one_winner(
            at_once(api, [("POST", f"{project}/branches", {"branch": {"name": name}})] * racers),
            "BRANCH_ALREADY_EXISTS",
        )
        op_ids += [o["id"] for o in won["operations"]]
    pr_1 = next(
        b["id"]
        for b in api.http.get(f"{project}/branches").json()["branches"]
        if b["name"] == "pr-1"
    )
    role = {"role": {"name": "app"}}
    database = {"database": {"name": "app_db", "owner_name": "neondb_owner"}}
    endpoint = {"endpoint": {"branch_id": pr_1, "type": "read_write"}}
    for path, request, code in (
        (f"{branch}/roles", role, "ROLE_ALREADY_EXISTS"),
        (f"{branch}/databases", database, "DATABASE_ALREADY_EXISTS"),
        (f"{project}/endpoints", endpoint, "ENDPOINT_ALREADY_EXISTS"),
    ):
        won = _one_winner(at_once(api, [("POST", path, request)] * 10), code)
        op_ids += [o["id"] for o in won["operations"]]

    ops = api.wait_operations(pid, op_ids)
    assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
    branches = [b["name"] for b in api.http.get(f"{project}/branches").json()["branches"]]
    assert sorted(branches) == ["main", "pr-1", "pr-2"]
    roles = [r["name"] for r in api.http.get(f"{branch}/roles").json()["roles"]]
    assert sorted(roles) == ["app", "neondb_owner"]
    databases = [d["name"] for d in api.http.get(f"{branch}/databases").json()["databases"]]
    assert sorted(databases) == ["app_db", "neondb"]
    endpoints = api.http.get(f"{project}/endpoints").json()["endpoints"]
    assert sorted(e["branch_id"] for e in endpoints) == sorted([main, pr_1])
    # No operation was left behind by a refused request: only the winners' (and the project's).
    listed = api.http.get(f"{project}/operations", params={"limit": 1000}).json()["operations"]
    assert sorted(o["id"] for o in listed) == sorted(
        [*op_ids, *(o["id"] for o in body["operations"])]
    )
    assert_consistent(api.server, api, pid)


# -- C7: exact pages under ties and concurrent inserts ------------------------------------------


async def _insert_tied(server: Server, project_id: str, count: int, at: int) -> None:
    """``count`` operations created in one store transaction, all at the instant ``at``."""
    store = await open_server_store(server)
    try:
        async with store.write() as tx:
            await tx.insert_operations([finished_operation(project_id, at) for _ in range(count)])
    finally:
        await store.close()


def _all_pages(api: Api, pid: str, limit: int) -> Iterator[list[dict[str, Any]]]:
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit}
        if cursor is not None:
            params["cursor"] = cursor
        page = api.http.get(f"/projects/{pid}/operations", params=params)
        assert page.status_code == 200, page.text
        ops = page.json()["operations"]
        if not ops:
            return
        assert len(ops) <= limit
        yield ops
        cursor = page.json()["pagination"]["cursor"]  # verbatim, as a client does


def _all_ids(api: Api, pid: str) -> list[str]:
    listed = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()
    return [o["id"] for o in listed["operations"]]


def test_pages_are_exact_with_tied_timestamps_and_while_operations_are_added(api: Api) -> None:
    body = api.create_ready_project(name="pages")
    pid = body["project"]["id"]
    # Five operations written in one transaction at one instant (as Postgres' now() would give
    # them), the project's latest; then three more, later.
    latest = max(_us(o["created_at"]) for o in body["operations"])
    asyncio.run(_insert_tied(api.server, pid, 5, latest))
    patches = [
        api.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": s}})
        for s in (3600, 3601, 3602)
    ]
    for r in patches:
        api.settled(pid, r)
    everything = _all_ids(api, pid)
    assert len(everything) == len(set(everything)) == 2 + 5 + 3
    for limit in (1, 3):
        assert [o["id"] for page in _all_pages(api, pid, limit) for o in page] == everything

    # Paging while operations are added: one after every page, so each page is read with newer
    # operations in the list than the page before. What existed at the first page's request
    # comes exactly once, in order; what was added belongs to a new first page.
    existing = _all_ids(api, pid)
    seen: list[str] = []
    added: list[str] = []
    for retention, page in enumerate(_all_pages(api, pid, 2), start=3700):
        seen += [o["id"] for o in page]
        r = api.http.patch(
            f"/projects/{pid}", json={"project": {"history_retention_seconds": retention}}
        )
        assert r.status_code == 200, r.text
        added += [o["id"] for o in r.json()["operations"]]
    assert seen == existing
    assert _all_ids(api, pid) == [*reversed(added), *existing]
    api.wait_operations(pid, added)
