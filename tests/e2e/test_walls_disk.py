"""Each project has a disk share of its own, which no write of its tenant can pass (issue 20).

As root, a project's directory is a filesystem of its own (tenants/volumes.py). Project A's
tenant, from the shell its compute hands it (its role made superuser, as a Postgres CVE would),
fills its share; another account's compute keeps writing and the platform keeps answering; A
writes again once the file is gone. Branch copies inside a share are clones (XFS reflink); a
deleted project's filesystem goes with it; a restart (or a reboot: nothing mounted) mounts every
share again before anything reads it.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from tests.e2e.test_walls_os import Project, make_superuser, run_program
from tests.support import (
    Api,
    Server,
    mounts_under,
    running_server,
    stop_postmasters,
    unmount_volumes,
    wait_for,
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="a filesystem per project needs root (loop devices, mount)"
)

SHARE_MIB = 512
SLOW = 5.0  # seconds: an answer slower than this while a tenant fills its disk counts as frozen


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(PGPLANE_DISK_PER_PROJECT=str(SHARE_MIB)) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("walls-disk@example.com")
    with Api(server, key) as client:
        yield client


@pytest.fixture(scope="module")
def victim(server: Server) -> Iterator[tuple[Api, Project]]:
    """Project B, another account's, writing while A fills its share."""
    _, key = server.create_key("walls-disk-victim@example.com")
    with Api(server, key) as client:
        b = Project(server, client.create_ready_project(name="victim"))
        b.query("CREATE TABLE b_rows (v text)")
        yield client, b


def _filesystem(path: os.PathLike[str]) -> tuple[int, int]:
    """(size, used) of the filesystem holding ``path``, in bytes."""
    fs = os.statvfs(path)
    return fs.f_blocks * fs.f_frsize, (fs.f_blocks - fs.f_bfree) * fs.f_frsize


def _on_the_host(server: Server, project_id: str) -> int:
    """What the project's filesystem takes of the machine's disk: its image's allocated blocks,
    at most its size and the host's few blocks of file metadata (the disk's own usage moves
    with whatever else the machine writes meanwhile)."""
    return (server.data_dir / "volumes" / f"{project_id}.img").stat().st_blocks * 512


def test_each_project_is_a_filesystem_of_its_own(
    server: Server, api: Api, victim: tuple[Api, Project]
) -> None:
    _, b = victim
    a = Project(server, api.create_ready_project(name="mine"))
    for project in (a, b):
        assert project.dir in mounts_under(server.data_dir)
        size, _ = _filesystem(project.dir)
        assert (SHARE_MIB - 128) << 20 < size <= SHARE_MIB << 20  # less its log
    assert os.stat(a.dir).st_dev != os.stat(b.dir).st_dev != os.stat(server.data_dir).st_dev
    images = server.data_dir / "volumes"
    assert os.stat(images).st_mode & 0o777 == 0o700  # root's: no tenant reads another's image
    assert sorted(p.name for p in images.iterdir()) == sorted([f"{a.id}.img", f"{b.id}.img"])


def test_a_tenant_filling_its_share_stops_at_it_and_no_one_else_notices(
    server: Server, api: Api, victim: tuple[Api, Project]
) -> None:
    b_api, b = victim
    a = Project(server, api.create_ready_project(name="filler"))
    make_superuser(a)
    a.query("CREATE TABLE a_rows (v text)")

    # From its compute's shell, as its OS user: write until the disk says no.
    started = time.monotonic()
    rc, out = run_program(a, f"dd if=/dev/zero of=fill bs=1M count={2 * SHARE_MIB}")
    assert rc != 0 and "No space left on device" in out, out
    assert time.monotonic() - started < 120
    size, used = _filesystem(a.dir)
    assert size - used < 32 << 20  # A's share is full
    assert _on_the_host(server, a.id) < (SHARE_MIB + 8) << 20  # the machine's disk: no more

    # Another account writes and reads on; the platform answers in its usual time.
    insert = "INSERT INTO b_rows SELECT repeat('b', 1000) FROM generate_series(1, 2000)"
    for i in range(5):
        t0 = time.monotonic()
        assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=SLOW).status_code == 200
        assert b_api.http.get(f"/projects/{b.id}").status_code == 200
        b.query(insert)
        assert b.query("SELECT count(*) FROM b_rows") == [(2000 * (i + 1),)]
        assert time.monotonic() - t0 < SLOW
    r = api.http.get(f"/projects/{a.id}/operations")
    assert r.status_code == 200

    # A's own writes fail on its full share (an error, or its postmaster restarting)...
    with pytest.raises(psycopg.Error):
        a.query("INSERT INTO a_rows SELECT repeat('a', 1000) FROM generate_series(1, 50000)")
    # ...and work again once it freed the space (as its OS user: a compute that PANICked on
    # its WAL restarts on its own, and meanwhile takes no SQL).
    owner = a.pgdata.stat()
    argv = ["setpriv", f"--reuid={owner.st_uid}", f"--regid={owner.st_gid}", "--clear-groups"]
    subprocess.run([*argv, "rm", str(a.pgdata / "fill")], check=True)

    def a_writes() -> bool:
        try:
            a.query("INSERT INTO a_rows VALUES ('again')")
        except psycopg.Error:
            return False
        return True

    wait_for("A's writes after it freed its share", a_writes, timeout=90, server=server)


def test_what_a_tenant_writes_to_its_log_or_socket_directory_counts_against_it(
    server: Server, api: Api
) -> None:
    """The other two places its compute may write: its postmaster's stderr (a root's file,
    which the tenant reaches through the descriptor it inherits) and its socket directory."""
    t = Project(server, api.create_ready_project(name="chatty"))
    make_superuser(t)
    rc, out = run_program(t, f"dd if=/dev/zero bs=1M count={2 * SHARE_MIB} >&2")
    assert rc != 0, out
    assert t.log.stat().st_size < SHARE_MIB << 20
    rc, out = run_program(t, f"dd if=/dev/zero of={t.socket_dir}/fill bs=1M count={2 * SHARE_MIB}")
    assert rc != 0 and "No space left on device" in out, out
    assert _on_the_host(server, t.id) < (SHARE_MIB + 8) << 20
    api.settled(t.id, api.http.delete(f"/projects/{t.id}"))


def test_a_branch_inside_a_share_is_a_clone(server: Server, api: Api) -> None:
    assert "on xfs (branch copies are clones)" in server.log(), "scripts/test installs xfsprogs"
    c = Project(server, api.create_ready_project(name="cloned"))
    c.query("CREATE TABLE big AS SELECT repeat('c', 1000) AS v FROM generate_series(1, 100000)")
    table_bytes = c.query("SELECT pg_total_relation_size('big')")[0][0]
    assert table_bytes > 90 << 20
    _, before = _filesystem(c.dir)
    api.settled(c.id, api.http.post(f"/projects/{c.id}/branches", json={"branch": {}}))
    _, after = _filesystem(c.dir)
    # A copy would add the table again; a clone adds the new branch's WAL and metadata.
    assert after - before < table_bytes / 3, (after - before, table_bytes)


def test_a_deleted_project_takes_its_filesystem_with_it(server: Server, api: Api) -> None:
    d = Project(server, api.create_ready_project(name="doomed"))
    image = server.data_dir / "volumes" / f"{d.id}.img"
    assert image.is_file()
    api.settled(d.id, api.http.delete(f"/projects/{d.id}"))
    wait_for("the project's filesystem gone", lambda: not d.dir.exists(), server=server)
    assert not image.exists()
    assert d.dir not in mounts_under(server.data_dir)
    loops = subprocess.run(
        ["losetup", "-j", str(image)], capture_output=True, text=True, check=True
    )
    assert loops.stdout == ""


def test_after_a_reboot_every_share_is_mounted_again_and_a_raised_share_grows_it(
    server: Server, victim: tuple[Api, Project]
) -> None:
    _, b = victim
    rows = b.query("SELECT count(*) FROM b_rows")
    server.stop()
    stop_postmasters(server.data_dir)
    unmount_volumes(server.data_dir)  # what a reboot leaves: nothing running, nothing mounted
    assert mounts_under(server.data_dir) == []
    server.env["PGPLANE_DISK_PER_PROJECT"] = str(2 * SHARE_MIB)  # and the operator raised it
    server.start()
    assert b.query("SELECT count(*) FROM b_rows") == rows  # woken on its share, data whole
    assert b.dir in mounts_under(server.data_dir)
    size, _ = _filesystem(b.dir)
    assert size > (2 * SHARE_MIB - 128) << 20  # grown to the new share
