"""Snapshots behind the tenant walls (DESIGN §6).

Another account's snapshot is the same 404 as one that does not exist, on every snapshot route.
A tenant that holds its compute's OS user cannot reach its snapshots once taken (their directory
is root's alone), and what it planted in one while it was being built (a link to a file of the
host, a FIFO) is never followed nor waited on: restoring it fails with the reason, counting and
deleting it leave the link's target alone, and the platform answers meanwhile.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from pgplane.compute.local.layout import Layout
from tests.e2e.test_walls_os import Project
from tests.e2e.test_walls_tenant_files import as_os_user
from tests.support import Api, Server, running_server, wait_for

# The builds pause at their end, before the seal, long enough for the tenant to plant its files
# (one per test).
PAUSE_MS = 8000


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(
        PGPLANE_FAILPOINTS=f"create_snapshot:built=2*sleep({PAUSE_MS})",
        PGPLANE_RETRY_BASE_SECONDS="0.2",
    ) as srv:
        yield srv


def _api(server: Server, account: str) -> Api:
    _, key = server.create_key(f"{account}-{time.monotonic_ns()}@example.com")
    return Api(server, key)


def _error(r: httpx.Response) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["code"], body["message"]


def test_another_accounts_snapshot_is_the_same_404_as_none(server: Server) -> None:
    with _api(server, "walls-snap-a") as a, _api(server, "walls-snap-b") as b:
        pa = a.create_ready_project(name="a")["project"]["id"]
        pb_body = b.create_ready_project(name="b")
        pb = pb_body["project"]["id"]
        r = b.http.post(f"/projects/{pb}/branches/{pb_body['branch']['id']}/snapshot")
        theirs = b.settled(pb, r)["snapshot"]["id"]
        for snapshot_id in (theirs, "snap-made-up-a1b2c3d4"):
            base = f"/projects/{pa}/snapshots/{snapshot_id}"
            answers = [
                _error(a.http.patch(base, json={"snapshot": {"name": "mine"}})),
                _error(a.http.delete(base)),
                _error(a.http.post(f"{base}/restore", json={})),
            ]
            assert answers == [(404, "NOT_FOUND", "snapshot not found")] * 3, answers
        # Their project, by any route, is a project that does not exist.
        made_up = "made-up-project-12345678"
        for project_id in (pb, made_up):
            answers = [
                _error(a.http.get(f"/projects/{project_id}/snapshots")),
                _error(a.http.delete(f"/projects/{project_id}/snapshots/{theirs}")),
                _error(a.http.post(f"/projects/{project_id}/snapshots/{theirs}/restore")),
                _error(a.http.post(f"/projects/{project_id}/branches/br-x-1/snapshot")),
                _error(a.http.get(f"/projects/{project_id}/branches/br-x-1/backup_schedule")),
            ]
            assert {x[0] for x in answers} == {404}, answers
            assert {x[2] for x in answers} == {"project not found"}, answers
        assert [s["id"] for s in b.http.get(f"/projects/{pb}/snapshots").json()["snapshots"]] == [
            theirs
        ]


def _top(server: Server, pid: str, snapshot_id: str) -> Path:
    return Layout(server.data_dir.resolve()).project_dir(pid) / "snapshots" / snapshot_id


@pytest.mark.skipif(os.geteuid() != 0, reason="one OS user per project needs root")
def test_a_tenants_files_in_its_snapshot_are_never_trusted(server: Server) -> None:
    with _api(server, "walls-snap-forger") as api:
        body = api.create_ready_project(name="forger")
        a = Project(server, body)
        pid, main = a.id, body["branch"]["id"]
        needle = "failpoint create_snapshot:built reached"
        before = server.log().count(needle)
        r = api.http.post(f"/projects/{pid}/branches/{main}/snapshot")
        assert r.status_code == 200, r.text
        snapshot: dict[str, Any] = r.json()["snapshot"]
        top = _top(server, pid, snapshot["id"])
        server.wait_for_log(needle, times=before + 1)
        # While it is built, its data is the tenant's: it plants a link to a host file and a
        # FIFO where root will read.
        pgdata = top / "pgdata"
        as_os_user(a, f"ln -s /etc/shadow {pgdata}/global/stolen && mkfifo {pgdata}/base/stall")
        as_os_user(a, f"ln -s /etc/passwd {pgdata}/pg_wal/000000010000000000000042")
        api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])

        # Sealed: the tenant cannot reach it any more.
        done = subprocess.run(
            ["setpriv", f"--reuid={a.user}", f"--regid={a.user}", "--clear-groups",
             "ls", str(pgdata)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert done.returncode != 0 and "Permission denied" in done.stderr, done
        (shown,) = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
        assert shown["full_size"] > 0  # counted by the walker, which follows no link

        # Restored: refused with the reason, never followed nor waited on.
        started = time.monotonic()
        r = api.http.post(f"/projects/{pid}/snapshots/{snapshot['id']}/restore", json={})
        assert r.status_code == 200, r.text
        (op,) = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]], timeout=120)
        assert op["status"] == "failed", op
        assert "symbolic link" in op["error"] or "not a file" in op["error"], op
        # The file named, never where the platform keeps it on the machine.
        assert str(server.data_dir.resolve()) not in op["error"], op
        assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=5).status_code == 200
        assert time.monotonic() - started < 60
        restored = Layout(server.data_dir.resolve()).pgdata(pid, r.json()["branch"]["id"])
        assert not restored.exists() and not restored.with_name("pgdata.tmp").exists()

        # Deleted: the link goes, its target stays.
        r = api.http.delete(f"/projects/{pid}/snapshots/{snapshot['id']}")
        assert r.status_code == 202, r.text
        api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        wait_for("the snapshot's files to go", lambda: not top.exists(), server=server)
        assert Path("/etc/shadow").is_file() and Path("/etc/passwd").is_file()
