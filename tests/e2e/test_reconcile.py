"""``pgplane serve`` restarted after a crash makes the postmasters match the store."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import psycopg

from pgplane.compute.local.cold import archive
from pgplane.compute.local.cold.archive import tree_checksums
from pgplane.compute.local.tenants.volumes import Volumes
from tests.stores import store_sql
from tests.support import Api, postmaster_pid, running_server


def _postmaster_pid(data_dir: Path, pid: str) -> int | None:
    files = list(data_dir.glob(f"projects/{pid}/branches/*/pgdata/postmaster.pid"))
    if not files:
        return None
    return postmaster_pid(data_dir, files[0].parent)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _state(api: Api, pid: str, eid: str) -> str:
    return str(api.http.get(f"/projects/{pid}/endpoints/{eid}").json()["endpoint"]["current_state"])


def _starts(api: Api, pid: str) -> int:
    ops = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000}).json()["operations"]
    return len([o for o in ops if o["action"] == "start_compute"])


def test_a_sigterm_stops_the_platform_gracefully_and_leaves_computes_running() -> None:
    # uvicorn raised the signal again after serving, and its default action ended the process
    # before the engine, proxy and store were stopped: a graceful stop was a kill.
    with running_server() as server:
        _, key = server.create_key("sigterm@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="sigterm")
            pid = project["project"]["id"]
            postmaster = _postmaster_pid(server.data_dir, pid)
            assert postmaster is not None
            process = server.process
            assert process is not None
            server.stop(signal.SIGTERM)
            assert process.returncode == 0, server.log()
            assert server.log().rstrip().endswith("pgplane stopped"), server.log()[-2000:]
            assert _alive(postmaster)  # computes outlive the platform, by design

            server.start()
            assert _postmaster_pid(server.data_dir, pid) == postmaster  # adopted, not restarted
            with psycopg.connect(project["connection_uris"][0]["connection_uri"]) as conn:
                assert conn.execute("select 1").fetchone() == (1,)


def test_restart_adopts_stops_and_records() -> None:
    with running_server() as server:
        _, key = server.create_key("reconcile@example.com")
        with Api(server, key) as api:
            kept = api.create_ready_project(name="kept")
            orphan = api.create_ready_project(name="orphan")
            vanished = api.create_ready_project(name="vanished")
            ids = {
                name: (p["project"]["id"], p["endpoints"][0]["id"])
                for name, p in (("kept", kept), ("orphan", orphan), ("vanished", vanished))
            }
            pids = {name: _postmaster_pid(server.data_dir, ids[name][0]) for name in ids}
            assert all(pids.values()), pids

            server.stop(signal.SIGKILL)
            # While pgplane is down: the store forgets one compute runs, another one dies.
            store_sql(server).execute(
                "UPDATE endpoints SET current_state = 'idle' WHERE id = ?", [ids["orphan"][1]]
            )
            vanished_pid = pids["vanished"]
            assert vanished_pid is not None
            # Its whole group: the postmaster's own, or the sandbox's whose pid 1 leads it.
            os.killpg(os.getpgid(vanished_pid), signal.SIGKILL)
            server.start()

            # Adopted: the same postmaster serves, no new start.
            pid, eid = ids["kept"]
            before = _starts(api, pid)
            assert _postmaster_pid(server.data_dir, pid) == pids["kept"]
            assert _state(api, pid, eid) == "active"
            with psycopg.connect(kept["connection_uris"][0]["connection_uri"]) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
            assert _starts(api, pid) == before

            # Stopped: the store said it should not run.
            orphan_pid = pids["orphan"]
            assert orphan_pid is not None
            deadline = time.monotonic() + 30
            while _alive(orphan_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not _alive(orphan_pid)
            assert _state(api, *ids["orphan"]) == "idle"

            # Recorded idle: nothing served it; the next connection wakes it.
            pid, eid = ids["vanished"]
            assert _state(api, pid, eid) == "idle"
            with psycopg.connect(vanished["connection_uris"][0]["connection_uri"]) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
            assert _state(api, pid, eid) == "active"


def test_restart_attaches_a_project_found_archived() -> None:
    with running_server() as server:
        _, key = server.create_key("attach@example.com")
        with Api(server, key) as api:
            archived = api.create_ready_project(name="archived")
            apid, aeid = archived["project"]["id"], archived["endpoints"][0]["id"]
            r = api.http.post(f"/projects/{apid}/endpoints/{aeid}/suspend")
            api.wait_operations(apid, [o["id"] for o in r.json()["operations"]])
            server.stop()
            # The project's data is found only in the cold archive (moved there by hand).
            project_dir = server.data_dir / "projects" / apid
            sums = tree_checksums(project_dir / "branches")
            archive.pack(project_dir, server.data_dir / "archive" / apid)
            if os.path.ismount(project_dir):  # as root: the project's own filesystem
                Volumes(server.data_dir / "volumes", 0, "xfs").remove(apid, project_dir)
            else:
                shutil.rmtree(project_dir)
            server.start()

            def attached() -> list[dict[str, Any]]:
                ops = api.http.get(f"/projects/{apid}/operations").json()["operations"]
                return [o for o in ops if o["action"] == "tenant_attach"]

            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not (
                attached() and attached()[0]["status"] == "finished"
            ):
                time.sleep(0.1)
            assert [o["status"] for o in attached()] == ["finished"]
            assert tree_checksums(project_dir / "branches") == sums
            with psycopg.connect(archived["connection_uris"][0]["connection_uri"]) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
