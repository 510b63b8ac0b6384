"""History: branches at a point in time or LSN, restores and resets, retention, over HTTP and
the Postgres protocol against a real server (its history keeper every second)."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support import Api, Server, running_server, wait_for


@pytest.fixture(scope="module")
def history_server() -> Iterator[Server]:
    with running_server(
        PGPLANE_HISTORY_SECONDS="1", PGPLANE_HISTORY_BASE_BYTES=str(48 << 20)
    ) as srv:
        yield srv


@pytest.fixture
def hapi(history_server: Server) -> Iterator[Api]:
    _, key = history_server.create_key(f"history-{time.monotonic_ns()}")
    with Api(history_server, key) as client:
        yield client


def _rows(uri: str) -> list[int]:
    with psycopg.connect(uri, connect_timeout=10) as conn:
        return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v").fetchall()]


def _commit(uri: str, value: int) -> tuple[str, str]:
    """Insert ``value`` in a transaction of its own; Postgres' clock and LSN once committed (a
    point after this commit and before the next one)."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (%s)", (value,))
        lsn = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        now = conn.execute("SELECT clock_timestamp()").fetchone()
    assert lsn is not None and now is not None
    moment: datetime.datetime = now[0]
    return moment.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z"), lsn[0]


def _project_with_table(api: Api, name: str) -> tuple[dict[str, Any], str, str]:
    project = api.create_ready_project(name=name)
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
    return project, pid, uri


def _branch(api: Api, pid: str, **branch: object) -> dict[str, Any]:
    r = api.http.post(
        f"/projects/{pid}/branches", json={"branch": branch, "endpoints": [{"type": "read_write"}]}
    )
    return api.settled(pid, r)


def test_branches_at_a_time_and_an_lsn_hold_exactly_what_was_committed_by_then(
    hapi: Api,
) -> None:
    project, pid, uri = _project_with_table(hapi, "pitr")
    main = project["branch"]["id"]
    _commit(uri, 1)
    t1, lsn1 = _commit(uri, 2)
    time.sleep(0.05)
    _commit(uri, 3)
    t2, lsn2 = _commit(uri, 4)
    time.sleep(0.05)
    _commit(uri, 5)

    at_time = _branch(hapi, pid, name="at-t1", parent_id=main, parent_timestamp=t1)
    assert _rows(at_time["connection_uris"][0]["connection_uri"]) == [1, 2]
    at_lsn = _branch(hapi, pid, name="at-lsn2", parent_id=main, parent_lsn=lsn2)
    assert _rows(at_lsn["connection_uris"][0]["connection_uri"]) == [1, 2, 3, 4]
    shown = hapi.http.get(f"/projects/{pid}/branches/{at_lsn['branch']['id']}").json()["branch"]
    assert shown["parent_lsn"] is not None
    assert _rows(uri) == [1, 2, 3, 4, 5]  # the parent, untouched

    # The same on a suspended parent.
    endpoint_id = project["endpoints"][0]["id"]
    hapi.suspend(pid, endpoint_id)
    again = _branch(hapi, pid, name="at-t2", parent_id=main, parent_timestamp=t2)
    assert _rows(again["connection_uris"][0]["connection_uri"]) == [1, 2, 3, 4]
    at_lsn1 = _branch(hapi, pid, name="at-lsn1", parent_id=main, parent_lsn=lsn1)
    assert _rows(at_lsn1["connection_uris"][0]["connection_uri"]) == [1, 2]


def _history_bytes(server: Server, pid: str, branch_id: str) -> int:
    top = server.data_dir / "projects" / pid / "branches" / branch_id
    total = 0
    for sub in ("wal", "base"):
        for path in Path(top, sub).rglob("*"):
            if path.is_file():
                total += path.stat().st_size
    return total


def test_shrinking_the_retention_frees_old_history(hapi: Api, history_server: Server) -> None:
    project, pid, uri = _project_with_table(hapi, "retention")
    main = project["branch"]["id"]
    with psycopg.connect(uri, autocommit=True) as conn:
        for _ in range(4):  # ~5 segments of WAL: past the keeper's 48 MB, a new base state
            conn.execute("INSERT INTO t SELECT generate_series(1, 400000)")
    bases = history_server.data_dir / "projects" / pid / "branches" / main / "base"
    wait_for(
        "a second base state",
        lambda: len([p for p in bases.iterdir() if (p / "base.json").is_file()]) >= 2,
        timeout=120,
        server=history_server,
    )
    before = _history_bytes(history_server, pid, main)
    r = hapi.http.patch(f"/projects/{pid}", json={"project": {"history_retention_seconds": 1}})
    hapi.settled(pid, r)
    after = wait_for(
        "old history freed",
        lambda: (b := _history_bytes(history_server, pid, main)) < before and b,
        timeout=60,
        server=history_server,
    )
    assert after < before
