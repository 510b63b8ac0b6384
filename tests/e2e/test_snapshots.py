"""Snapshots (Neon's snapshot API) against a real server and real Postgres: taken at the head,
a time or an LSN, listed, renamed, deleted, restored into a new branch or onto a branch, kept
past the history window they were taken in, counted in the project's storage."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from pgplane.core import clock, ids
from tests.stores import server_store
from tests.support import Api, Server, running_server, wait_for

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores(postgresql="slow")


@pytest.fixture(scope="module")
def snap_server(store_backend: str) -> Iterator[Server]:
    with running_server(
        store=server_store(store_backend),
        PGPLANE_HISTORY_SECONDS="1",
        PGPLANE_SCHEDULER_SECONDS="0.5",
    ) as srv:
        yield srv


@pytest.fixture
def sapi(snap_server: Server) -> Iterator[Api]:
    _, key = snap_server.create_key(f"snapshots-{time.monotonic_ns()}")
    with Api(snap_server, key) as client:
        yield client


def rows(uri: str) -> list[int]:
    with psycopg.connect(uri, connect_timeout=30) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v").fetchall()]


def commit(uri: str, value: int) -> str:
    """Insert ``value``; Postgres' clock once committed (a point before the next commit)."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (%s)", (value,))
        now = conn.execute("SELECT clock_timestamp()").fetchone()
    assert now is not None
    moment: datetime.datetime = now[0]
    return moment.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")


def project_with_table(api: Api, name: str) -> tuple[dict[str, Any], str, str]:
    project = api.create_ready_project(name=name)
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
    return project, pid, uri


def snapshot(api: Api, pid: str, branch_id: str, **query: str) -> dict[str, Any]:
    r = api.http.post(f"/projects/{pid}/branches/{branch_id}/snapshot", params=query)
    body = api.settled(pid, r)
    # Neon's action names: a snapshot is a timeline of its own (Neon's enum has no snapshot's).
    assert [o["action"] for o in body["operations"]] == ["create_timeline"]
    return dict(body["snapshot"])


def listed(api: Api, pid: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{pid}/snapshots")
    assert r.status_code == 200, r.text
    return list(r.json()["snapshots"])


def branch_uri(api: Api, pid: str, branch_id: str) -> str:
    """A compute on the branch, and a connection string of its owner role."""
    r = api.http.post(
        f"/projects/{pid}/endpoints",
        json={"endpoint": {"branch_id": branch_id, "type": "read_write"}},
    )
    api.settled(pid, r)
    params = {"branch_id": branch_id, "role_name": "neondb_owner", "database_name": "neondb"}
    r = api.http.get(f"/projects/{pid}/connection_uri", params=params)
    assert r.status_code == 200, r.text
    return str(r.json()["uri"])


def restore(api: Api, pid: str, snapshot_id: str, **body: object) -> dict[str, Any]:
    r = api.http.post(f"/projects/{pid}/snapshots/{snapshot_id}/restore", json=body)
    return api.settled(pid, r)


def test_create_list_rename_delete(sapi: Api, snap_server: Server) -> None:
    project, pid, uri = project_with_table(sapi, "snap-crud")
    main = project["branch"]["id"]
    commit(uri, 1)
    taken = snapshot(sapi, pid, main, name="before-migration")
    assert taken["name"] == "before-migration"
    assert taken["source_branch_id"] == main
    assert taken["manual"] is True
    assert "expires_at" not in taken  # a manual snapshot is kept until deleted
    assert taken["slug"] == taken["id"]  # none given: its id

    # A slug: Neon's form, once among the project's live snapshots.
    where = f"/projects/{pid}/branches/{main}/snapshot"
    for bad in ("Upper", "9lives", "ends-", "a" * 64, "under_score"):
        r = sapi.http.post(where, params={"slug": bad})
        assert r.status_code == 400 and "slug" in r.json()["message"], (bad, r.text)
    slugged = snapshot(sapi, pid, main, slug="before-migration")
    assert slugged["slug"] == "before-migration"
    r = sapi.http.post(where, params={"slug": "before-migration"})
    assert r.status_code == 409 and "slug 'before-migration'" in r.json()["message"], r.text
    r = sapi.http.delete(f"/projects/{pid}/snapshots/{slugged['id']}")
    sapi.wait_operations(pid, [o["id"] for o in r.json()["operations"]])

    (shown,) = listed(sapi, pid)
    assert shown["id"] == taken["id"] and shown["slug"] == taken["id"]
    assert shown["lsn"] and shown["full_size"] > 0  # known once built
    top = snap_server.data_dir / "projects" / pid / "snapshots" / taken["id"]
    assert (top / "pgdata").is_dir()

    later = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3)).replace(
        microsecond=0
    )
    r = sapi.http.patch(
        f"/projects/{pid}/snapshots/{taken['id']}",
        json={"snapshot": {"name": "renamed", "expires_at": later.isoformat()}},
    )
    assert r.status_code == 200, r.text
    assert r.json()["snapshot"]["name"] == "renamed"
    assert r.json()["snapshot"]["expires_at"] == later.strftime("%Y-%m-%dT%H:%M:%SZ")
    r = sapi.http.patch(
        f"/projects/{pid}/snapshots/{taken['id']}", json={"snapshot": {"expires_at": None}}
    )
    assert r.status_code == 200 and "expires_at" not in r.json()["snapshot"], r.text

    # Counted in the project's storage.
    stored = sapi.http.get(f"/projects/{pid}").json()["project"]["synthetic_storage_size"]
    assert stored >= shown["full_size"]
    # And in its consumption history, over the time it has been kept.
    hour = datetime.datetime.now(datetime.UTC).replace(minute=0, second=0, microsecond=0)
    r = sapi.http.get(
        "/consumption_history/v2/projects",
        params={
            "project_ids": pid,
            "metrics": "snapshot_storage_bytes_month",
            "granularity": "hourly",
            "from": (hour - datetime.timedelta(hours=1)).isoformat(),
            "to": (hour + datetime.timedelta(hours=1)).isoformat(),
        },
    )
    assert r.status_code == 200, r.text
    (kept,) = r.json()["projects"]
    values = [
        m["value"]
        for frame in kept["periods"][0]["consumption"]
        for m in frame["metrics"]
        if m["metric_name"] == "snapshot_storage_bytes_month"
    ]
    assert values and values[-1] > 0, r.text

    r = sapi.http.delete(f"/projects/{pid}/snapshots/{taken['id']}")
    assert r.status_code == 202, r.text
    ops = sapi.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert [(o["action"], o["status"]) for o in ops] == [("delete_timeline", "finished")]
    assert listed(sapi, pid) == []
    assert not top.exists()
    assert sapi.http.delete(f"/projects/{pid}/snapshots/{taken['id']}").status_code == 404


def test_bad_input_is_a_400_naming_the_field(sapi: Api) -> None:
    project, pid, _ = project_with_table(sapi, "snap-bad")
    main = project["branch"]["id"]
    base = f"/projects/{pid}/branches/{main}/snapshot"
    for query, field in [
        ({"lsn": "nope"}, "lsn"),
        ({"timestamp": "yesterday"}, "timestamp"),
        ({"timestamp": "2020-01-01T00:00:00Z"}, "timestamp"),
        ({"lsn": "0/1", "timestamp": "2020-01-01T00:00:00Z"}, "lsn"),
        ({"expires_at": "2020-01-01T00:00:00Z"}, "expires_at"),
        ({"expires_at": "soon"}, "expires_at"),
        ({"name": ""}, "snapshot name"),
    ]:
        r = sapi.http.post(base, params=query)
        assert r.status_code == 400, (query, r.text)
        assert field in r.json()["message"], (query, r.text)
    taken = snapshot(sapi, pid, main)
    where = f"/projects/{pid}/snapshots/{taken['id']}"
    for body, field in [
        ({"snapshot": {"expires_at": "2020-01-01T00:00:00Z"}}, "expires_at"),
        ({"snapshot": {"name": "x" * 300}}, "name"),
    ]:
        r = sapi.http.patch(where, json=body)
        assert r.status_code == 400, (body, r.text)
        assert field in r.json()["message"], (body, r.text)
    r = sapi.http.post(f"{where}/restore", json={"finalize_restore": "yes"})
    assert r.status_code == 400 and "finalize_restore" in r.json()["message"], r.text
    r = sapi.http.post(f"{where}/restore", json={"target_branch_id": "br-none-00000000"})
    assert r.status_code == 404, r.text
    assert sapi.http.post(f"/projects/{pid}/snapshots/snap-none/restore").status_code == 404


def test_restore_of_a_time_before_a_change_into_a_new_branch(sapi: Api) -> None:
    project, pid, uri = project_with_table(sapi, "snap-time")
    main = project["branch"]["id"]
    commit(uri, 1)
    before = commit(uri, 2)
    time.sleep(0.05)
    commit(uri, 3)
    taken = snapshot(sapi, pid, main, timestamp=before, name="at-2")
    assert taken["timestamp"] == before[:19] + "Z"
    body = restore(sapi, pid, taken["id"], name="restored")
    assert body["branch"]["name"] == "restored"
    assert [o["action"] for o in body["operations"]] == ["create_branch"]
    assert rows(branch_uri(sapi, pid, body["branch"]["id"])) == [1, 2]
    assert rows(uri) == [1, 2, 3]  # the source, untouched


def test_restore_with_finalize_makes_a_new_branch_in_the_targets_place(sapi: Api) -> None:
    """Neon's spec: a restore is into a new branch; ``finalize_restore`` finalizes it at once
    (the target's computes move to it, it takes the target's name, the target is kept)."""
    project, pid, uri = project_with_table(sapi, "snap-onto")
    main = project["branch"]["id"]
    commit(uri, 1)
    taken = snapshot(sapi, pid, main)  # the head
    commit(uri, 2)
    body = restore(sapi, pid, taken["id"], finalize_restore=True)  # the target: the source
    restored = body["branch"]
    assert restored["id"] != main and restored["name"] == project["branch"]["name"]
    assert (restored["restored_from"], restored["restore_status"]) == (taken["id"], "finalized")
    assert restored["default"] and restored["parent_id"] == main
    assert rows(uri) == [1]  # the same connection string, the snapshot's data
    endpoint = sapi.endpoint(pid, project["endpoints"][0]["id"])
    assert endpoint["branch_id"] == restored["id"]
    kept = sapi.http.get(f"/projects/{pid}/branches/{main}").json()["branch"]
    assert kept["name"] == f"{project['branch']['name']} (old)" and not kept["default"]
    assert rows(branch_uri(sapi, pid, main)) == [1, 2]  # the state it replaced

    # ``name`` with finalize_restore names the branch replaced, as finalize_restore's own does.
    again = restore(
        sapi, pid, taken["id"], target_branch_id=restored["id"], finalize_restore=True,
        name="before-again",
    )  # fmt: skip
    assert again["branch"]["name"] == project["branch"]["name"]
    replaced = sapi.http.get(f"/projects/{pid}/branches/{restored['id']}").json()["branch"]
    assert replaced["name"] == "before-again"


def test_a_snapshot_outlives_the_history_window_and_its_branch(
    sapi: Api, snap_server: Server
) -> None:
    project, pid, _ = project_with_table(sapi, "snap-window")
    main = project["branch"]["id"]
    r = sapi.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "dev"}, "endpoints": [{"type": "read_write"}]},
    )
    dev = sapi.settled(pid, r)
    dev_uri = dev["connection_uris"][0]["connection_uri"]
    # A new branch's history starts with its first base state, taken in the background.
    bases = snap_server.data_dir / "projects" / pid / "branches" / dev["branch"]["id"] / "base"
    wait_for("dev's first base state", lambda: any(bases.glob("*/base.json")), server=snap_server)
    commit(dev_uri, 7)
    before = commit(dev_uri, 8)
    time.sleep(0.05)
    commit(dev_uri, 9)
    taken = snapshot(sapi, pid, dev["branch"]["id"], timestamp=before)
    # The window shrinks to a second: the history that held the point is freed.
    r = sapi.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 1}})
    assert r.status_code == 200, r.text
    sapi.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    time.sleep(1.5)
    r = sapi.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"parent_id": dev["branch"]["id"], "parent_timestamp": before}},
    )
    assert r.status_code == 400, r.text  # the history no longer holds it
    r = sapi.http.delete(f"/projects/{pid}/branches/{dev['branch']['id']}")
    sapi.settled(pid, r)
    body = restore(sapi, pid, taken["id"], target_branch_id=main, name="from-gone")
    assert rows(branch_uri(sapi, pid, body["branch"]["id"])) == [7, 8]


def test_deleting_the_project_frees_its_snapshots(sapi: Api, snap_server: Server) -> None:
    project, pid, _ = project_with_table(sapi, "snap-gone")
    taken = snapshot(sapi, pid, project["branch"]["id"])
    top = snap_server.data_dir / "projects" / pid / "snapshots" / taken["id"]
    assert top.exists()
    r = sapi.http.delete(f"/projects/{pid}")
    assert r.status_code == 200, r.text
    sapi.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    wait_for("the project's data to go", lambda: not top.exists(), server=snap_server)


def test_a_snapshot_goes_with_a_detached_project_and_comes_back() -> None:
    """Packed into the cold archive with its project, sealed still when it comes back, and
    restorable; a restore asked while detached reattaches the project first."""
    with running_server(
        PGPLANE_DETACH_AFTER_SECONDS="2", PGPLANE_SCHEDULER_SECONDS="0.2"
    ) as server:
        _, key = server.create_key("cold-snapshots@example.com")
        with Api(server, key) as api:
            project, pid, uri = project_with_table(api, "cold-snapshots")
            commit(uri, 1)
            taken = snapshot(api, pid, project["branch"]["id"])
            commit(uri, 2)
            api.suspend(pid, project["endpoints"][0]["id"])
            wait_for(
                "tenant_detach",
                lambda: any(
                    o["action"] == "tenant_detach" and o["status"] == "finished"
                    for o in api.operations(pid)
                ),
                server=server,
            )
            top = server.data_dir / "projects" / pid / "snapshots" / taken["id"]
            assert not top.exists()
            body = restore(api, pid, taken["id"], name="from-the-cold")
            assert "tenant_reattach" in [o["action"] for o in api.operations(pid)]
            assert top.stat().st_mode & 0o777 == 0o700  # sealed as it was
            assert rows(branch_uri(api, pid, body["branch"]["id"])) == [1]


def finalize(api: Api, pid: str, branch_id: str, **body: object) -> httpx.Response:
    return api.http.post(f"/projects/{pid}/branches/{branch_id}/finalize_restore", json=body)


def by_id(api: Api, pid: str) -> dict[str, dict[str, Any]]:
    return {b["id"]: b for b in api.http.get(f"/projects/{pid}/branches").json()["branches"]}


def test_restore_then_finalize_moves_the_computes(sapi: Api) -> None:
    project, pid, uri = project_with_table(sapi, "snap-two-step")
    main, eid = project["branch"]["id"], project["endpoints"][0]["id"]
    commit(uri, 1)
    taken = snapshot(sapi, pid, main)
    commit(uri, 2)
    body = restore(sapi, pid, taken["id"], name="preview")
    preview = body["branch"]
    assert preview["parent_id"] == main and preview["restored_as"] == main
    assert (preview["restored_from"], preview["restore_status"]) == (taken["id"], "restored")
    # Inspected through a compute of its own, which must go before main's can move in.
    preview_uri = branch_uri(sapi, pid, preview["id"])
    assert rows(preview_uri) == [1] and rows(uri) == [1, 2]
    r = finalize(sapi, pid, preview["id"])
    assert r.status_code == 409 and "read-write compute" in r.json()["message"], r.text
    (own,) = sapi.http.get(f"/projects/{pid}/branches/{preview['id']}/endpoints").json()[
        "endpoints"
    ]
    sapi.settled(pid, sapi.http.delete(f"/projects/{pid}/endpoints/{own['id']}"))
    # A read-only compute of main moves too, and follows the moved read-write one.
    r = sapi.http.post(
        f"/projects/{pid}/endpoints", json={"endpoint": {"branch_id": main, "type": "read_only"}}
    )
    replica = sapi.settled(pid, r)["endpoint"]["id"]
    params = {"database_name": "neondb", "role_name": "neondb_owner", "endpoint_id": replica}
    replica_uri = sapi.http.get(f"/projects/{pid}/connection_uri", params=params).json()["uri"]
    assert rows(replica_uri) == [1, 2]

    done = sapi.settled(pid, finalize(sapi, pid, preview["id"]))
    assert [o["action"] for o in done["operations"]] == ["suspend_compute"] * 2 + [
        "start_compute"
    ] * 2
    assert rows(uri) == [1]  # the same connection string, the snapshot's data
    assert rows(replica_uri) == [1]
    assert sapi.endpoint(pid, replica)["branch_id"] == preview["id"]
    moved = sapi.endpoint(pid, eid)
    assert moved["branch_id"] == preview["id"] and moved["current_state"] == "active"
    branches = by_id(sapi, pid)
    now, old = branches[preview["id"]], branches[main]
    assert (now["name"], now["default"], now["restore_status"]) == ("main", True, "finalized")
    assert (old["name"], old["default"], old.get("parent_id")) == ("main (old)", False, None)
    assert now["parent_id"] == main  # the replaced state, kept as its parent
    assert rows(branch_uri(sapi, pid, main)) == [1, 2]

    r = finalize(sapi, pid, preview["id"])
    assert r.status_code == 409 and "finalized already" in r.json()["message"], r.text
    r = finalize(sapi, pid, main)
    assert r.status_code == 400 and "no restore to finalize" in r.json()["message"], r.text


def test_finalize_names_the_old_branch_and_refuses_bad_input(
    sapi: Api, snap_server: Server
) -> None:
    project, pid, uri = project_with_table(sapi, "snap-finalize-bad")
    main = project["branch"]["id"]
    sapi.suspend(pid, project["endpoints"][0]["id"])  # an idle compute moves, and stays idle
    taken = snapshot(sapi, pid, main)
    restored = restore(sapi, pid, taken["id"])["branch"]
    for sent, field in [
        ({"name": ""}, "name"),
        ({"name": "x" * 300}, "name"),
        ({"name": 7}, "name"),
        ({"name": "main"}, "main"),  # taken: the restored branch's new name
    ]:
        r = finalize(sapi, pid, restored["id"], **sent)
        assert r.status_code in (400, 409), (sent, r.text)
        assert field in r.json()["message"], (sent, r.text)
    r = sapi.http.post(
        f"/projects/{pid}/branches/{restored['id']}/finalize_restore",
        content=b"[]",
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 400, r.text
    # Another account's branch is the same 404 as one that names nothing.
    _, key = snap_server.create_key(f"snap-other-{time.monotonic_ns()}@example.com")
    with Api(snap_server, key) as other:
        theirs = other.http.post(f"/projects/{pid}/branches/{restored['id']}/finalize_restore")
        nothing = other.http.post(
            f"/projects/{ids.new_project_id()}/branches/{ids.new_branch_id()}/finalize_restore"
        )
        for r in (theirs, nothing, finalize(sapi, pid, ids.new_branch_id())):
            assert r.status_code == 404, r.text
        assert theirs.json()["message"] == nothing.json()["message"]
        r = other.http.post(f"/projects/{pid}/snapshots/{taken['id']}/restore", json={})
        assert r.status_code == 404, r.text
    assert by_id(sapi, pid)[restored["id"]]["restore_status"] == "restored"  # nothing changed
    # A second restore waiting to replace main, and main's backup schedule: both follow it.
    second = restore(sapi, pid, taken["id"], name="second")["branch"]
    schedule = {"schedule": [{"frequency": "daily", "hour": 3, "retention_seconds": 86400}]}
    r = sapi.http.put(f"/projects/{pid}/branches/{main}/backup_schedule", json=schedule)
    assert r.status_code == 200, r.text

    # An expiring branch would become the default: refused, naming the expiry, until cleared.
    branch_url = f"/projects/{pid}/branches/{restored['id']}"
    soon = clock.format_s(clock.now_us() + 86_400_000_000)
    r = sapi.http.patch(branch_url, json={"branch": {"expires_at": soon}})
    sapi.settled(pid, r)
    r = finalize(sapi, pid, restored["id"], name="before")
    assert r.status_code == 400 and "expires_at" in r.json()["message"], r.text
    assert by_id(sapi, pid)[restored["id"]]["restore_status"] == "restored"
    sapi.settled(pid, sapi.http.patch(branch_url, json={"branch": {"expires_at": None}}))
    done = sapi.settled(pid, finalize(sapi, pid, restored["id"], name="before"))
    assert [o["action"] for o in done["operations"]] == ["suspend_compute"]
    branches = by_id(sapi, pid)
    assert branches[main]["name"] == "before" and branches[restored["id"]]["name"] == "main"
    assert branches[second["id"]]["restored_as"] == restored["id"]
    for branch_id, held in ((restored["id"], schedule), (main, {"schedule": []})):
        r = sapi.http.get(f"/projects/{pid}/branches/{branch_id}/backup_schedule")
        assert r.json() == held, r.text
    assert sapi.endpoint(pid, project["endpoints"][0]["id"])["current_state"] == "idle"
    assert rows(uri) == []  # woken on the restored data by the same connection string
