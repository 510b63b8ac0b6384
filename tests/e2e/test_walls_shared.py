"""Shared storage and a tenant that holds its compute's OS user (as root).

The tenant writes its own branch's WAL archive (its postmasters do): there it plants a link
named like a segment, to another project's data file, and a FIFO named like the next one. The
platform ships that archive to shared storage as root: it never follows the link (the other
project's bytes appear nowhere on shared storage), never blocks on the FIFO (the rounds go on
shipping real segments, the API answers), and ships neither. Shared storage itself is root's,
0700: the tenant's user cannot even list it.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.support import Api, Server, running_server, wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="tenant OS users need root")


@pytest.fixture(scope="module")
def node() -> Iterator[tuple[Server, Path]]:
    shared = Path(tempfile.mkdtemp(prefix="pgplane-test-shared-"))
    try:
        with running_server(
            PGPLANE_SHARED_DIR=str(shared),
            PGPLANE_SHIP_SECONDS="0.3",
            PGPLANE_ARCHIVE_TIMEOUT_SECONDS="1",
        ) as server:
            yield server, shared
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def _head(shared: Path, pid: str, branch_id: str) -> dict[str, str]:
    path = shared / "history" / pid / branch_id / "head.json"
    return dict(json.loads(path.read_bytes())["wal"]) if path.exists() else {}


def test_a_tenants_forged_archive_is_never_followed_nor_waited_on(
    node: tuple[Server, Path],
) -> None:
    server, shared = node
    _, key = server.create_key("walls-shared@example.com")
    with Api(server, key) as api:
        tenant = api.create_ready_project(name="tenant")
        victim = api.create_ready_project(name="victim")
        pid, branch_id = tenant["project"]["id"], tenant["branch"]["id"]
        vid, vbranch = victim["project"]["id"], victim["branch"]["id"]
        secret = server.data_dir / "projects" / vid / "branches" / vbranch / "pgdata" / "PG_VERSION"
        user = pwd.getpwnam(f"pgp-{pid}")

        wal = server.data_dir / "projects" / pid / "branches" / branch_id / "wal"
        link, fifo = wal / "0000000100000000000000F0", wal / "0000000100000000000000F1"
        os.symlink(secret, link)
        os.lchown(link, user.pw_uid, user.pw_gid)
        os.mkfifo(fifo, 0o600)
        os.chown(fifo, user.pw_uid, user.pw_gid)

        # Rounds go on: a segment written after the plant is shipped (so they passed it).
        uri = tenant["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, connect_timeout=60) as conn:
            conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
            (segment,) = conn.execute(
                "SELECT pg_walfile_name(pg_current_wal_insert_lsn())"
            ).fetchone() or ("",)
        wait_for(
            f"{segment} shipped after the plant",
            lambda: segment in _head(shared, pid, branch_id),
            server=server,
        )
        shipped = _head(shared, pid, branch_id)
        assert link.name not in shipped and fifo.name not in shipped
        assert not (shared / "history" / pid / branch_id / "wal" / link.name).exists()
        assert not (shared / "history" / pid / branch_id / "wal" / fifo.name).exists()
        # The victim's bytes are nowhere on shared storage under the tenant's project.
        planted = secret.read_bytes()
        for path in (shared / "history" / pid).rglob("*"):
            if path.is_file() and path.stat().st_size == len(planted):
                assert path.read_bytes() != planted, path
        assert "not a plain file" in server.log()

        # Nothing waited: the platform answers, the victim's work goes on.
        assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=10).status_code == 200
        r = api.http.post(f"/projects/{vid}/branches", json={"branch": {"name": "dev"}})
        api.settled(vid, r)

        # Shared storage is root's alone: the tenant's user cannot list it.
        st = shared.stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700)
        listing = subprocess.run(
            [
                "setpriv",
                f"--reuid={user.pw_uid}",
                f"--regid={user.pw_gid}",
                "--clear-groups",
                "ls",
                str(shared),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert listing.returncode != 0, listing.stdout
