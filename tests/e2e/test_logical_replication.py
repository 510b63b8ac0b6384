"""Logical replication, as Neon's users run it: ``enable_logical_replication`` restarts the
project's computes with ``wal_level=logical`` and cannot be undone; a plain PostgreSQL
subscribes to a publication through the proxy's TCP door and receives every change, and
``pg_recvlogical`` streams ``pgoutput`` the same way; a compute with a subscriber does not scale
to zero, and does once it leaves.
"""

from __future__ import annotations

import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.pgstore import store_cluster
from tests.support import Api, Server, pg_binary, plaintext, running_server, wait_for

_subscribers = itertools.count()


def _settings(api: Api, pid: str, settings: dict[str, Any]) -> Any:
    return api.http.patch(f"/projects/{pid}", json={"project": {"settings": settings}})


def _show(uri: str, *queries: str) -> list[Any]:
    with psycopg.connect(uri, connect_timeout=30) as conn:
        return [conn.execute(q).fetchone()[0] for q in queries]  # type: ignore[index]


def test_enabling_restarts_the_computes_with_wal_level_logical_for_good(api: Api) -> None:
    project = api.create_ready_project(name="logical-on")
    pid = project["project"]["id"]
    uri = project["connection_uris"][0]["connection_uri"]
    replicates = "select rolreplication from pg_roles where rolname = current_user"
    assert _show(uri, "show wal_level", replicates) == ["replica", False]

    r = _settings(api, pid, {"enable_logical_replication": "yes"})
    assert r.status_code == 400 and "enable_logical_replication" in r.json()["message"], r.text

    before = psycopg.connect(uri, connect_timeout=30)
    try:
        body = api.settled(pid, _settings(api, pid, {"enable_logical_replication": True}))
        assert {o["action"] for o in body["operations"]} == {"apply_config"}
        assert body["project"]["settings"]["enable_logical_replication"] is True
        # The compute was restarted for it: the session open before is gone.
        with pytest.raises(psycopg.OperationalError):
            before.execute("select 1")
    finally:
        before.close()
    shown = _show(uri, "show wal_level", replicates, "show max_slot_wal_keep_size")
    assert shown == ["logical", True, "4GB"]
    assert _show(uri, "show idle_replication_slot_timeout") == ["40h"]

    r = _settings(api, pid, {"enable_logical_replication": False})
    assert r.status_code == 400, r.text
    assert "cannot be turned off" in r.json()["message"], r.text
    got = api.http.get(f"/projects/{pid}").json()["project"]["settings"]
    assert got["enable_logical_replication"] is True

    # A new branch's compute and roles are the project's.
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "child"}, "endpoints": [{"type": "read_write"}]},
    )
    child = api.settled(pid, r)
    child_uri = child["connection_uris"][0]["connection_uri"]
    assert _show(child_uri, "show wal_level", replicates) == ["logical", True]

    # wal_level is the project's to set, not an endpoint's.
    eid = project["endpoints"][0]["id"]
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{eid}",
        json={"endpoint": {"settings": {"pg_settings": {"wal_level": "minimal"}}}},
    )
    assert r.status_code == 400 and "wal_level" in r.json()["message"], r.text


@pytest.fixture(scope="module")
def quick() -> Iterator[Server]:
    """A server whose computes suspend after 2 idle seconds."""
    with running_server(
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="2", PGPLANE_SCHEDULER_SECONDS="0.2"
    ) as srv:
        yield srv


def _rows(url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url, connect_timeout=30) as conn:
        return conn.execute("select id, v from t order by id").fetchall()


def test_a_plain_postgresql_subscribes_through_the_proxy(quick: Server, tmp_path: Path) -> None:
    _, key = quick.create_key("subscriber@example.com")
    with Api(quick, key) as api:
        project = api.create_ready_project(
            name="publisher", settings={"enable_logical_replication": True}
        )
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        uri = project["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
            conn.execute("create table t (id int primary key, v text)")
            conn.execute("insert into t values (1, 'one'), (2, 'two')")
            conn.execute("create publication pub for table t")

        cluster = store_cluster()
        name = f"subscriber_{next(_subscribers)}"
        with psycopg.connect(cluster.url(), autocommit=True) as conn:
            conn.execute(f"create database {name}")
        sub_url = cluster.url(name)
        with psycopg.connect(sub_url, autocommit=True) as conn:
            conn.execute("create table t (id int primary key, v text)")
            # The cluster's libpq has no TLS (the wheel's): the proxy takes SCRAM in plaintext.
            conn.execute(
                psycopg.sql.SQL("create subscription s connection {} publication pub").format(
                    psycopg.sql.Literal(plaintext(uri))
                )
            )
        try:
            wait_for("the initial copy", lambda: _rows(sub_url) == [(1, "one"), (2, "two")])
            with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
                conn.execute("insert into t values (3, 'three')")
                conn.execute("update t set v = 'uno' where id = 1")
                conn.execute("delete from t where id = 2")
            wait_for("the changes", lambda: _rows(sub_url) == [(1, "uno"), (3, "three")])

            # Subscribed, the compute stays up well past its idle timeout (2 s).
            suspends = _suspends(api, pid)
            time.sleep(6)
            quick.wait_for_ticks(2)
            assert api.endpoint(pid, eid)["current_state"] == "active"
            assert _suspends(api, pid) == suspends

            _pg_recvlogical_streams_pgoutput(uri, tmp_path)

            # Gone (its slot kept, inactive), the subscriber no longer keeps it up.
            with psycopg.connect(sub_url, autocommit=True) as conn:
                conn.execute("alter subscription s disable")
            wait_for("the idle suspend", lambda: api.endpoint(pid, eid)["current_state"] == "idle")
            (slots,) = _show(uri, "select array_agg(slot_name::text) from pg_replication_slots")
            assert sorted(slots) == ["rl", "s"]
        finally:
            with psycopg.connect(sub_url, autocommit=True) as conn:
                conn.execute("alter subscription s disable")
                conn.execute("alter subscription s set (slot_name = none)")
                conn.execute("drop subscription s")
            with psycopg.connect(cluster.url(), autocommit=True) as conn:
                conn.execute(f"drop database {name} with (force)")


def _suspends(api: Api, pid: str) -> int:
    return len([o for o in api.operations(pid) if o["action"] == "suspend_compute"])


def _recvlogical(*args: str) -> None:
    done = subprocess.run(
        [pg_binary("pg_recvlogical"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _pg_recvlogical_streams_pgoutput(uri: str, tmp_path: Path) -> None:
    """``pg_recvlogical`` with ``pgoutput`` through the proxy: a slot made over a replication
    connection, then a change streamed up to where the WAL stood after it."""
    conninfo = plaintext(uri)
    _recvlogical("-d", conninfo, "--slot", "rl", "--create-slot", "-P", "pgoutput")
    with psycopg.connect(uri, connect_timeout=30, autocommit=True) as conn:
        conn.execute("insert into t values (4, 'streamed by pg_recvlogical')")
        end = conn.execute("select pg_current_wal_lsn()::text").fetchone()[0]  # type: ignore[index]
    out = tmp_path / "changes"
    _recvlogical(
        "-d", conninfo, "--slot", "rl", "--start", "-E", end, "-f", str(out), "--no-loop",
        "-o", "proto_version=1", "-o", "publication_names=pub",
    )  # fmt: skip
    assert b"streamed by pg_recvlogical" in out.read_bytes()
