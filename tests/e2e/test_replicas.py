"""Read-only computes (read replicas) through the real server, proxy and Postgres (issue 21).

A replica follows its branch's read-write compute by streaming while it runs (a commit is seen
within a second), from the branch's WAL archive when nothing streams, refuses writes with
Postgres' own error, suspends and wakes like any compute, and leaves no data behind.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest
from psycopg import errors

from tests.support import Api, Server, running_server, wait_for

# A commit on the primary is on every replica within this (the bound).
FOLLOW_SECONDS = 1.0


def _replica(api: Api, pid: str, bid: str, **endpoint: object) -> dict[str, Any]:
    r = api.http.post(
        f"/projects/{pid}/endpoints",
        json={"endpoint": {"branch_id": bid, "type": "read_only", **endpoint}},
    )
    body = api.settled(pid, r)
    assert r.status_code == 201
    return api.endpoint(pid, body["endpoint"]["id"])


def _uri(
    api: Api, pid: str, eid: str | None = None, role: str = "neondb_owner", bid: str | None = None
) -> str:
    params = {"database_name": "neondb", "role_name": role}
    if eid is not None:
        params["endpoint_id"] = eid
    if bid is not None:
        params["branch_id"] = bid
    r = api.http.get(f"/projects/{pid}/connection_uri", params=params)
    assert r.status_code == 200, r.text
    return str(r.json()["uri"])


def _seen_within(uri: str, query: str, expected: object, seconds: float) -> float:
    """Poll the replica until ``query`` answers ``expected``; how long it took (bounded)."""
    started = time.monotonic()
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        while True:
            row = conn.execute(query).fetchone()
            took = time.monotonic() - started
            if row is not None and row[0] == expected:
                return took
            assert took < seconds, f"{query} still answers {row}, not {expected}, after {took:.2f}s"
            time.sleep(0.01)


def test_a_replica_follows_refuses_writes_and_suspends(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="replicas")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    primary = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (n int)")
        conn.execute("INSERT INTO t VALUES (1)")

    replica = _replica(api, pid, bid)
    assert replica["type"] == "read_only"
    assert replica["current_state"] == "active"
    assert replica["host"].startswith(replica["id"])
    uri = _uri(api, pid, replica["id"])
    assert replica["id"] in uri and uri != primary

    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (1,)
        with pytest.raises(errors.ReadOnlySqlTransaction) as refused:
            conn.execute("INSERT INTO t VALUES (2)")
        assert refused.value.sqlstate == "25006"

    # Streaming: each commit on the primary is seen within a second.
    with psycopg.connect(primary, autocommit=True) as conn:
        for n in range(2, 7):
            conn.execute("INSERT INTO t VALUES (%s)", (n,))
            _seen_within(uri, "SELECT max(n) FROM t", n, FOLLOW_SECONDS)
        conn.execute("INSERT INTO t VALUES (7)")

    # The primary suspended: the replica holds the branch's latest state.
    api.suspend(pid, project["endpoints"][0]["id"])
    _seen_within(uri, "SELECT max(n) FROM t", 7, FOLLOW_SECONDS)

    # Suspended, the replica holds no data; a connection wakes it, as of the branch's head.
    api.suspend(pid, replica["id"])
    replica_dir = server.data_dir / "projects" / pid / "branches" / bid / "replicas" / replica["id"]
    assert not replica_dir.exists()
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT max(n) FROM t").fetchone() == (7,)
    assert api.endpoint(pid, replica["id"])["current_state"] == "active"

    # The primary woken (by a connection): the replica streams from it again.
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (8)")
    _seen_within(uri, "SELECT max(n) FROM t", 8, FOLLOW_SECONDS)


def test_several_replicas_and_no_primary(api: Api, server: Server) -> None:
    project = api.create_ready_project(name="several")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    primary = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS n")
    replicas = [_replica(api, pid, bid) for _ in range(2)]
    uris = [_uri(api, pid, r["id"]) for r in replicas]
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (2)")
    for uri in uris:
        _seen_within(uri, "SELECT max(n) FROM t", 2, FOLLOW_SECONDS)

    # Without a read-write compute the branch still has its replicas; what the platform writes
    # on the branch (a role, by a temporary postmaster) reaches them through the WAL archive.
    r = api.http.delete(f"/projects/{pid}/endpoints/{project['endpoints'][0]['id']}")
    api.settled(pid, r)
    r = api.http.post(f"/projects/{pid}/branches/{bid}/roles", json={"role": {"name": "later"}})
    api.settled(pid, r)
    for uri in uris:
        _seen_within(uri, "SELECT count(*) FROM pg_roles WHERE rolname = 'later'", 1, 30)
    # A read-write compute added: the replicas stream from it.
    r = api.http.post(
        f"/projects/{pid}/endpoints", json={"endpoint": {"branch_id": bid, "type": "read_write"}}
    )
    api.settled(pid, r)
    with psycopg.connect(_uri(api, pid), autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (3)")
    for uri in uris:
        _seen_within(uri, "SELECT max(n) FROM t", 3, FOLLOW_SECONDS)
    third = _replica(api, pid, bid)
    with psycopg.connect(_uri(api, pid, third["id"], role="later")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("later",)
    with psycopg.connect(_uri(api, pid, third["id"])) as conn:
        assert conn.execute("SELECT max(n) FROM t").fetchone() == (3,)

    # Deleting an endpoint, then the branch's others with it, removes their data.
    r = api.http.delete(f"/projects/{pid}/endpoints/{replicas[0]['id']}")
    api.settled(pid, r)
    branch_dir = server.data_dir / "projects" / pid / "branches" / bid
    assert not (branch_dir / "replicas" / replicas[0]["id"]).exists()
    child = api.settled(
        pid,
        api.http.post(
            f"/projects/{pid}/branches",
            json={
                "branch": {"parent_id": bid},
                "endpoints": [{"type": "read_write"}, {"type": "read_only"}],
            },
        ),
    )
    assert [e["type"] for e in child["endpoints"]] == ["read_write", "read_only"]
    child_id = child["branch"]["id"]
    child_rw = _uri(api, pid, child["endpoints"][0]["id"], bid=child_id)
    child_ro = _uri(api, pid, child["endpoints"][1]["id"], bid=child_id)
    with psycopg.connect(child_rw, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (100)")
    _seen_within(child_ro, "SELECT max(n) FROM t", 100, FOLLOW_SECONDS)

    # Reset from its parent: the child's replica holds the parent's data, and follows on.
    r = api.http.post(
        f"/projects/{pid}/branches/{child_id}/restore", json={"source_branch_id": bid}
    )
    api.settled(pid, r)
    assert api.endpoint(pid, child["endpoints"][1]["id"])["current_state"] == "active"
    _seen_within(child_ro, "SELECT max(n) FROM t", 3, FOLLOW_SECONDS)
    with psycopg.connect(child_rw, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (101)")
    _seen_within(child_ro, "SELECT max(n) FROM t", 101, FOLLOW_SECONDS)

    api.settled(pid, api.http.delete(f"/projects/{pid}/branches/{child_id}"))
    assert not (server.data_dir / "projects" / pid / "branches" / child_id).exists()


def test_idle_replica_and_primary_suspend_on_their_own_and_wake() -> None:
    """Scale to zero: the stream between them is no client of either; each suspends when its
    clients are idle, and a connection wakes each."""
    with running_server(
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="2", PGPLANE_SCHEDULER_SECONDS="0.2"
    ) as quick:
        _, key = quick.create_key("idle-replica@example.com")
        with Api(quick, key) as api:
            project = api.create_ready_project(name="idle-replica")
            pid, bid = project["project"]["id"], project["branch"]["id"]
            primary_id = project["endpoints"][0]["id"]
            primary = project["connection_uris"][0]["connection_uri"]
            with psycopg.connect(primary, autocommit=True) as conn:
                conn.execute("CREATE TABLE t AS SELECT 1 AS n")
            replica = _replica(api, pid, bid)
            uri = _uri(api, pid, replica["id"])
            for eid in (primary_id, replica["id"]):
                wait_for(
                    f"{eid} suspended when idle",
                    lambda e=eid: api.endpoint(pid, e)["current_state"] == "idle",
                    server=quick,
                )
            with psycopg.connect(uri, connect_timeout=30) as conn:
                assert conn.execute("SELECT max(n) FROM t").fetchone() == (1,)
            assert api.endpoint(pid, replica["id"])["current_state"] == "active"
            assert api.endpoint(pid, primary_id)["current_state"] == "idle"
