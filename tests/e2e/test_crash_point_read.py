"""``pgplane serve`` killed while it reads a schema at a point of history: nothing is left.

The read rebuilds the point into a directory of its own in the branch's directory and serves it
with a temporary postmaster (compute/local/history/point_reads.py). Killed there
(``point_read:serving``), the platform leaves both behind; the next server's history keeper
stops that postmaster and removes the directory at its first round, and the branch's schema
reads as before.
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

import httpx
import psycopg

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.tenants.cgroups import Cgroups
from tests.crash import ENV as CRASH_ENV
from tests.crash import kill_at
from tests.support import Api, postmaster_pid, running_server, wait_for


def test_kill_while_a_schema_is_read_at_a_point() -> None:
    with running_server(
        **CRASH_ENV, PGPLANE_HISTORY_SECONDS="1", PGPLANE_FAILPOINTS="point_read:serving"
    ) as server:
        _, key = server.create_key("crash-point-read@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="read-at-a-point")
            pid, bid = body["project"]["id"], body["branch"]["id"]
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("CREATE TABLE before_the_point (id int)")
                row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
                assert row is not None
                conn.execute("CREATE TABLE after_the_point (id int)")
            url = f"/projects/{pid}/branches/{bid}/schema"
            params = {"db_name": "neondb", "lsn": str(row[0])}

            def read() -> None:  # cut off by the kill
                with contextlib.suppress(httpx.TransportError):
                    api.http.get(url, params=params, timeout=120)

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            kill_at(server, "point_read:serving")
            reader.join(30)
            branch_dir = Layout(server.data_dir.resolve()).branch_dir(pid, bid)
            (work,) = branch_dir.glob("point-*")
            serving = postmaster_pid(server.data_dir, work / "pgdata")
            assert serving is not None  # left running
            # The tenant's WAL replayed and read for its request, in a cgroup of the smallest
            # compute's size, as its own work always is (cgroups need root).
            record = Records(server.data_dir.resolve() / "postmasters").get(work / "pgdata")
            cgroup_name = None if record is None else record.cgroup
            if os.geteuid() == 0:
                assert cgroup_name, "the point read's postmaster runs in no cgroup"
                assert f"/{cgroup_name}\n" in Path(f"/proc/{serving}/cgroup").read_text()

            server.env.pop("PGPLANE_FAILPOINTS")
            server.start()
            wait_for(
                "the interrupted read's directory removed",
                lambda: not list(branch_dir.glob("point-*")),
                server=server,
            )
            assert postmaster_pid(server.data_dir, work / "pgdata") is None
            if cgroup_name:  # and its cgroup went with it
                cgroups, _ = Cgroups.find()
                assert cgroups is not None and cgroup_name not in set(cgroups.names())
            r = api.http.get(url, params=params)
            assert r.status_code == 200, r.text
            assert "before_the_point" in r.json()["sql"]
            assert "after_the_point" not in r.json()["sql"]
