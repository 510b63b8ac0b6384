"""The store stops taking writes under a running platform: clear 503s, and nothing is lost.

Scenario F7 beyond the locked store (``test_faults.py``): the store's disk is full, or its writes
fail. Two ways to do that to a running server, both what SQLite meets on a real machine:

- ``full``: the store lives on a filesystem of its own (a 16 MB tmpfs; ``pgplane.db`` is a
  symbolic link into it and SQLite keeps its WAL beside the real file), and a file fills it: the
  next write gets ENOSPC, which SQLite reports as SQLITE_FULL. Mounting needs root (CI here); as
  anyone else, only the next case runs.
- ``io-error``: the server's file size limit (RLIMIT_FSIZE, lowered from outside with
  prlimit(2)) drops to one byte, so every write past a file's first byte fails with EFBIG
  (Python ignores SIGXFSZ, which would otherwise kill the process): SQLite's SQLITE_IOERR, "disk
  I/O error". No privilege needed. The server's own log cannot be written meanwhile either.

One server goes through each outage in turn. Reads go on (the data is there); every write
answers 503 with the error body and ``Retry-After``, and a connection that would have to start
a compute is refused with a Postgres error that says why. An operation whose work finishes
during the outage is recorded by that attempt once the store is back, not redone; key uses seen
meanwhile are recorded late, not lost.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from pgplane.core import clock
from tests.crash import assert_consistent
from tests.support import Api, Server, running_server

ENV = {
    # A lease that runs out during the outage: the attempt must still be the one recorded.
    "PGPLANE_LEASE_SECONDS": "1",
    "PGPLANE_HEARTBEAT_SECONDS": "0.25",
    # Each outage begins while a branch copy is paused here, and the copy ends during it.
    "PGPLANE_FAILPOINTS": "create_branch:copied=2*sleep(1000)",
}


class Outage:
    """Makes the running server's store refuse writes, and lets it recover."""

    def __init__(self, how: str, server: Server, store_fs: Path | None = None) -> None:
        self.how = how
        self.server = server
        self.store_fs = store_fs  # the store's own filesystem, to fill (the ``full`` case)

    def begin(self) -> None:
        if self.store_fs is None:
            assert self.server.process is not None
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.prlimit(self.server.process.pid, resource.RLIMIT_FSIZE, (1, hard))
            return
        # Empty the WAL into the database and cut it to nothing: every later commit must grow
        # it (SQLite rewrites a WAL it has reset in place, which a full disk would not stop).
        with sqlite3.connect(self.server.data_dir / "pgplane.db") as db:
            assert db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0
        with (self.store_fs / "filler").open("wb", buffering=0) as filler:
            for chunk in (1 << 20, 4096, 1):  # down to the last byte
                with contextlib.suppress(OSError):
                    while True:
                        filler.write(b"\0" * chunk)
        assert shutil.disk_usage(self.store_fs).free == 0

    def end(self) -> None:
        if self.store_fs is None:
            assert self.server.process is not None
            _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.prlimit(self.server.process.pid, resource.RLIMIT_FSIZE, (hard, hard))
        else:
            (self.store_fs / "filler").unlink()


@contextlib.contextmanager
def outage_server() -> Iterator[tuple[Server, list[Outage]]]:
    """A server, and the outages it can be put through here (as root, its store on a tmpfs)."""
    if os.geteuid() != 0:
        with running_server(**ENV) as server:
            yield server, [Outage("io-error", server)]
        return
    mounted: list[Path] = []

    def prepare(data_dir: Path) -> None:
        store_fs = data_dir / "store"
        store_fs.mkdir(mode=0o700)
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(store_fs)],
            check=True,
        )
        mounted.append(store_fs)
        (data_dir / "pgplane.db").symlink_to(store_fs / "pgplane.db")

    try:
        with running_server(prepare=prepare, **ENV) as server:
            yield server, [Outage("full", server, mounted[0]), Outage("io-error", server)]
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)
            shutil.rmtree(path.parent, ignore_errors=True)


def test_a_store_that_cannot_write_answers_503_and_loses_nothing() -> None:
    with outage_server() as (server, outages):
        _, key = server.create_key("outage@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="outage")
            for outage in outages:
                _through(outage, api, body)
            with sqlite3.connect(server.data_dir / "pgplane.db") as db:
                assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


def _through(outage: Outage, api: Api, body: dict[str, Any]) -> None:
    """One outage, from a branch copy under way to everything as it was, plus that branch."""
    server = api.server
    pid, main, eid = body["project"]["id"], body["branch"]["id"], body["endpoints"][0]["id"]
    project, branch = f"/projects/{pid}", f"/projects/{pid}/branches/{main}"
    created = api.http.post("/api_keys", json={"key_name": f"fresh-{outage.how}"})
    assert created.status_code == 200, created.text
    fresh_id = created.json()["id"]
    # A suspended compute: a connection during the outage would need a start the store cannot
    # take, and is told so.
    api.settled(pid, api.http.post(f"{project}/endpoints/{eid}/suspend"))
    uri = body["connection_uris"][0]["connection_uri"]
    branches_before = _names(api, f"{project}/branches", "branches")
    ops_before = [o["id"] for o in _operations(api, pid)]
    state_before = _state(api, pid, main, eid)

    _ready(server)
    paused = "failpoint create_branch:copied reached"
    times = server.log().count(paused) + 1
    r = api.http.post(f"{project}/branches", json={"branch": {"name": outage.how}})
    assert r.status_code == 201, r.text
    in_flight, child = r.json()["operations"][0]["id"], r.json()["branch"]["id"]
    ops_before.append(in_flight)
    server.wait_for_log(paused, times=times)
    outage.begin()
    try:
        op = api.http.get(f"{project}/operations/{in_flight}").json()["operation"]
        assert op["status"] == "running", op
        _reads_go_on_and_writes_are_refused(api, outage.how, body, created.json())
        _not_ready(server, outage.how)
        with pytest.raises(psycopg.OperationalError, match="store is unavailable"):
            psycopg.connect(uri, connect_timeout=30).close()

        # The copy ends meanwhile; its outcome cannot be written, and the lease its heartbeat
        # cannot renew runs out: where the work used to be thrown away and done again.
        pgdata = server.data_dir / "projects" / pid / "branches" / child / "pgdata"
        _wait("the copy was put in place", pgdata.is_dir)
        _wait("the lease ran out", lambda: _lease_expires_at(server, in_flight) < clock.now_us())
    finally:
        outage.end()

    _wait("ready again", lambda: _readyz(server).status_code == 200)
    _ready(server)
    (op,) = api.wait_operations(pid, [in_flight])
    assert (op["status"], op["failures_count"]) == ("finished", 0), op
    _wait(
        "the fresh key's use during the outage is recorded",
        lambda: any(k["id"] == fresh_id and k["last_used_at"] for k in _keys(api)),
    )

    # Nothing of the refused requests exists; nothing was lost or done twice.
    assert _state(api, pid, main, eid) == state_before
    assert _names(api, f"{project}/branches", "branches") == sorted([*branches_before, outage.how])
    assert sorted(o["id"] for o in _operations(api, pid)) == sorted(ops_before)
    assert [k["name"] for k in _keys(api)].count(f"fresh-{outage.how}") == 1  # not revoked
    # And the store takes writes again, whole; the compute starts for the next connection.
    with psycopg.connect(uri, connect_timeout=30) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    role = {"role": {"name": f"after_{outage.how}"}}
    api.settled(pid, api.http.post(f"{branch}/roles", json=role))
    assert_consistent(server, api, pid)


def _reads_go_on_and_writes_are_refused(
    api: Api, how: str, body: dict[str, Any], fresh_key: dict[str, Any]
) -> None:
    """Every read answers as usual; every write that would succeed is a 503 (and would also
    pass every check before its commit: the refusal is the store's alone)."""
    pid, main, eid = body["project"]["id"], body["branch"]["id"], body["endpoints"][0]["id"]
    project, branch = f"/projects/{pid}", f"/projects/{pid}/branches/{main}"
    fresh_id = fresh_key["id"]
    for path in (
        "/projects",
        project,
        f"{project}/branches",
        f"{project}/endpoints",
        f"{project}/operations",
        f"{branch}/roles",
        f"{branch}/databases",
        f"{branch}/roles/neondb_owner/reveal_password",
        "/api_keys",
    ):
        read = api.http.get(path)
        assert read.status_code == 200, (how, path, read.text)
    with Api(api.server, fresh_key["key"]) as fresh:
        assert fresh.http.get("/projects").status_code == 200  # its first use

    for method, path, request in (
        ("POST", "/projects", {"project": {"name": "refused"}}),
        ("PATCH", project, {"project": {"name": "refused"}}),
        ("POST", f"{project}/branches", {"branch": {"name": "refused"}}),
        ("PATCH", branch, {"branch": {"name": "refused"}}),
        ("POST", f"{branch}/roles", {"role": {"name": "refused"}}),
        (
            "POST",
            f"{branch}/databases",
            {"database": {"name": "refused", "owner_name": "neondb_owner"}},
        ),
        ("POST", f"{project}/endpoints/{eid}/suspend", None),
        ("PATCH", f"{project}/endpoints/{eid}", {"endpoint": {"suspend_timeout_seconds": 600}}),
        ("POST", "/api_keys", {"key_name": "refused"}),
        ("DELETE", f"/api_keys/{fresh_id}", None),
    ):
        refused = api.http.request(method, path, json=request)
        assert refused.status_code == 503, (how, method, path, refused.text)
        assert refused.headers["content-type"].startswith("application/json")
        assert int(refused.headers["retry-after"]) >= 1
        error = refused.json()
        assert set(error) == {"code", "message", "request_id"}, error
        assert error["code"] == "SERVICE_UNAVAILABLE"
        assert "store is unavailable" in error["message"]


def _readyz(server: Server) -> httpx.Response:
    return httpx.get(f"http://127.0.0.1:{server.port}/readyz", timeout=30)


def _ready(server: Server) -> None:
    ready = _readyz(server)
    assert ready.status_code == 200, ready.text
    assert ready.json() == {
        "status": "ok",
        "checks": {"store": "ok", "operations": "ok", "scheduler": "ok"},
    }


def _not_ready(server: Server, how: str) -> None:
    """The readiness probe says the store is the trouble; the liveness probe still answers."""
    live = httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=30)
    assert (live.status_code, live.json()) == (200, {"status": "ok"})
    _wait("not ready", lambda: _readyz(server).status_code == 503)  # an answer is reused 1 s
    refused = _readyz(server)
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()
    assert set(error) == {"code", "message", "request_id"}, error
    assert error["code"] == "SERVICE_UNAVAILABLE"
    assert error["message"].startswith("not ready: store: "), (how, error)
    assert "store is unavailable" in error["message"]


def _state(api: Api, pid: str, main: str, eid: str) -> dict[str, Any]:
    """What a refused write would have changed."""
    project, branch = f"/projects/{pid}", f"/projects/{pid}/branches/{main}"
    endpoint = api.http.get(f"{project}/endpoints/{eid}").json()["endpoint"]
    return {
        "projects": _names(api, "/projects", "projects"),
        "roles": _names(api, f"{branch}/roles", "roles"),
        "databases": _names(api, f"{branch}/databases", "databases"),
        "endpoint": (endpoint["current_state"], endpoint["suspend_timeout_seconds"]),
        "keys": sorted(k["name"] for k in _keys(api)),
    }


def _names(api: Api, path: str, key: str) -> list[str]:
    r = api.http.get(path)
    assert r.status_code == 200, r.text
    return sorted(str(x["name"]) for x in r.json()[key])


def _keys(api: Api) -> list[dict[str, Any]]:
    r = api.http.get("/api_keys")
    assert r.status_code == 200, r.text
    return list(r.json())


def _operations(api: Api, pid: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["operations"])


def _lease_expires_at(server: Server, op_id: str) -> int:
    with sqlite3.connect(server.data_dir / "pgplane.db") as db:
        row = db.execute("SELECT lease_expires_at FROM operations WHERE id = ?", (op_id,))
        return int(row.fetchone()[0])


def _wait(what: str, ready: Callable[[], Any], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)
