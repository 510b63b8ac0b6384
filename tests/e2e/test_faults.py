"""Faults under a running platform: a compute killed, its port taken, a full disk, a locked store.

Each test breaks something the way the world does (SIGKILL, another program, a small disk, a
process holding the store's lock) and checks that the platform answers clearly, loses nothing and
recovers by itself.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from pgplane.store.sqlite.store import BUSY_SECONDS
from tests.crash import assert_consistent, postmasters
from tests.stores import store_sql
from tests.support import Api, Server, postmaster_pid, running_server, wait_for

ENV = {"PGPLANE_RETRY_BASE_SECONDS": "0.2", "PGPLANE_SCHEDULER_SECONDS": "0.2"}


def _connect(uri: str, attempts: int = 10) -> psycopg.Connection[Any]:
    """As a client does after losing its server: retry a few times."""
    for attempt in range(attempts):
        try:
            return psycopg.connect(uri, connect_timeout=30, autocommit=True)
        except psycopg.OperationalError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _postmaster_pid(server: Server, pid: str, branch_id: str) -> int:
    pgdata = server.data_dir / "projects" / pid / "branches" / branch_id / "pgdata"
    found = postmaster_pid(server.data_dir, pgdata)
    assert found is not None
    return found


def _endpoint_port(server: Server, eid: str) -> int:
    row = store_sql(server).one("SELECT port FROM endpoints WHERE id = ?", [eid])
    assert row is not None
    return int(row[0])


class AckWriter(threading.Thread):
    """A client inserting ids in autocommit through the proxy, reconnecting when cut off.

    ``acked`` holds the ids whose INSERT returned: committed, so they must never be lost. An
    INSERT cut off midway may or may not have committed; its id is never used again.
    """

    def __init__(self, uri: str) -> None:
        super().__init__()
        self.uri = uri
        self.acked: list[int] = []
        self.cut_off = 0
        self.stop = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                with _connect(self.uri) as conn:
                    while not self.stop.is_set():
                        n += 1
                        conn.execute("INSERT INTO acks VALUES (%s)", [n])
                        self.acked.append(n)
            except psycopg.OperationalError:
                self.cut_off += 1

    def wait_for(self, more: int) -> None:
        """Until ``more`` further inserts were acknowledged (so the compute serves again)."""
        mark = len(self.acked)
        deadline = time.monotonic() + 120
        while len(self.acked) < mark + more:
            assert self.is_alive(), "the writer gave up"
            assert time.monotonic() < deadline, f"no acknowledged insert since {mark}"
            time.sleep(0.01)


def _shm_segments() -> set[int]:
    """The ids of the machine's System V shared memory segments (what ``ipcs -m`` lists)."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    return {int(line.split()[1]) for line in lines}


def _shmid(pgdata: Path) -> int:
    """The System V segment of the postmaster serving ``pgdata`` (its pid file's 7th line)."""
    return int((pgdata / "postmaster.pid").read_text().splitlines()[6].split()[1])


def _sandbox_members(postmaster: int) -> set[tuple[int, int]]:
    """Every process in the postmaster's IPC namespace (its sandbox's), with its start time:
    once none is left, the kernel frees the namespace and all its shared memory (System V, and
    its own /dev/shm). Namespace ids are reused once freed, so processes are what is compared."""
    namespace = os.readlink(f"/proc/{postmaster}/ns/ipc")
    found = set()
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(proc / "ns" / "ipc") == namespace:
                    found.add((int(proc.name), _started(int(proc.name))))
    return found


def _started(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])


def _still_running(members: set[tuple[int, int]]) -> list[int]:
    alive = []
    for pid, started in members:
        with contextlib.suppress(OSError, IndexError):
            if _started(pid) == started:
                alive.append(pid)
    return alive


def _dsm_files(postmaster: int) -> set[Path]:
    """The POSIX dynamic shared memory a postmaster has mapped (``/dev/shm/PostgreSQL.*``)."""
    maps = Path(f"/proc/{postmaster}/maps").read_text().splitlines()
    return {Path(m.split()[-1]) for m in maps if "/PostgreSQL." in m}


def _processes_in(pgdata: Path) -> dict[int, int]:
    """Every process working in ``pgdata`` (a postmaster and all it forks chdir there): pid ->
    parent pid."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):  # exited meanwhile, or not ours to read
            if Path(os.readlink(proc / "cwd")) == pgdata:
                stat = (proc / "stat").read_text()
                found[int(proc.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def _only_the_live_postmaster_and_its_children(pgdata: Path, postmaster: int) -> bool:
    processes = _processes_in(pgdata)
    return postmaster in processes and all(
        postmaster in (pid, ppid) for pid, ppid in processes.items()
    )


ROUNDS = 10


def test_a_postmaster_killed_under_load_is_started_again_and_loses_nothing(api: Api) -> None:
    """Scenario F4: SIGKILL the postmaster under a writer, ten times; each time the next
    connection starts it again (one start), no acknowledged insert is lost, and nothing of the
    killed postmasters stays behind (processes, shared memory)."""
    server = api.server
    body = api.create_ready_project(name="killed")
    pid, branch_id = body["project"]["id"], body["branch"]["id"]
    uri = body["connection_uris"][0]["connection_uri"]
    pgdata = server.data_dir.resolve() / "projects" / pid / "branches" / branch_id / "pgdata"
    with _connect(uri) as conn:
        conn.execute("CREATE TABLE acks (id int PRIMARY KEY)")
    starts_before = len(_starts(api, pid))
    killed: list[tuple[int, int, set[Path]]] = []  # postmaster, its shm id, its DSM files
    members: set[tuple[int, int]] = set()  # every process of the killed sandboxes
    sandboxed = os.geteuid() == 0

    writer = AckWriter(uri)
    writer.start()
    try:
        for _ in range(ROUNDS):
            writer.wait_for(50)
            postmaster = _postmaster_pid(server, pid, branch_id)
            if sandboxed:
                members |= _sandbox_members(postmaster)
                killed.append((postmaster, -1, set()))
            else:
                killed.append((postmaster, _shmid(pgdata), _dsm_files(postmaster)))
            cut_off = writer.cut_off
            os.kill(postmaster, signal.SIGKILL)
            # A backend busy in a query may serve a few more before it sees its postmaster
            # gone; then the writer is cut off, and goes on through a compute started again.
            wait_for("the writer cut off", lambda: writer.cut_off > cut_off)  # noqa: B023
            writer.wait_for(50)
    finally:
        writer.stop.set()
        writer.join()

    # Each kill cost exactly one start, and it finished.
    starts = _starts(api, pid)
    assert len(starts) == starts_before + ROUNDS, starts
    assert {o["status"] for o in starts} == {"finished"}
    with _connect(uri) as conn:
        ids = {r[0] for r in conn.execute("SELECT id FROM acks").fetchall()}
    assert set(writer.acked) <= ids

    # Nothing of the killed postmasters is left: no orphan backend, no shared memory.
    live = _postmaster_pid(server, pid, branch_id)
    assert live not in {k[0] for k in killed}
    wait_for("no orphan backend", lambda: _only_the_live_postmaster_and_its_children(pgdata, live))
    if sandboxed:
        # Each sandbox's shared memory (System V and its own /dev/shm) lived in its own IPC
        # namespace, which the kernel frees with its last process: none is left in any.
        assert len(members) > 2 * ROUNDS  # bwrap, the postmaster and its children each time
        wait_for("every process of the killed sandboxes gone", lambda: not _still_running(members))
    else:
        segments = _shm_segments()
        assert _shmid(pgdata) in segments
        assert [shmid for _, shmid, _ in killed if shmid in segments] == []
        leaked = set().union(*(dsm for _, _, dsm in killed)) - _dsm_files(live)
        assert [f for f in leaked if f.exists()] == []
    assert_consistent(server, api, pid)


def _starts(api: Api, pid: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return [o for o in r.json()["operations"] if o["action"] == "start_compute"]


def test_a_taken_port_moves_the_compute_and_the_squatter_gets_no_client(api: Api) -> None:
    body = api.create_ready_project(name="squatted")
    pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
    uri = body["connection_uris"][0]["connection_uri"]
    with _connect(uri) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS v")
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    port = _endpoint_port(api.server, eid)

    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        squatter.setblocking(False)
        with _connect(uri) as conn:
            assert conn.execute("SELECT v FROM t").fetchone() == (1,)
        with pytest.raises(BlockingIOError):
            squatter.accept()  # nobody was sent to it
    moved = _endpoint_port(api.server, eid)
    # A sandboxed compute listens on no port of the machine (its network is its own): the
    # squatter takes nothing from it, and it keeps its port (the name of its socket).
    assert (moved == port) if "computes run sandboxed" in api.server.log() else (moved != port)
    starts = [
        o
        for o in api.http.get(f"/projects/{pid}/operations").json()["operations"]
        if o["action"] == "start_compute"
    ]
    assert starts[0]["status"] == "finished"
    assert_consistent(api.server, api, pid)


# -- the store locked by another process ----------------------------------------------------


LOCKED = "the store is locked by another process"


def test_a_locked_store_is_503_with_retry_after_and_reads_go_on() -> None:
    # A server of its own, with nothing else that writes on its own while the lock is held (no
    # scheduler pass, no flush of key uses, no node heartbeat): the only writer that waits is
    # the POST.
    quiet = {
        "PGPLANE_SCHEDULER_SECONDS": "3600",
        "PGPLANE_KEY_USE_FLUSH_SECONDS": "3600",
        "PGPLANE_NODE_HEARTBEAT_SECONDS": "3600",
        "PGPLANE_NODE_LEASE_SECONDS": "7200",
    }
    with running_server(**quiet) as server, Api(server, server.create_key("lock@x.io")[1]) as api:
        _a_locked_store_is_503_with_retry_after_and_reads_go_on(server, api)


def _a_locked_store_is_503_with_retry_after_and_reads_go_on(server: Server, api: Api) -> None:
    api.create_ready_project(name="before-the-lock")
    results: dict[str, Any] = {}
    finished: list[str] = []
    with sqlite3.connect(server.data_dir / "pgplane.db", isolation_level=None) as holder:
        holder.execute("BEGIN IMMEDIATE")  # what another program writing the file would hold

        def create() -> None:
            results["post"] = api.http.post("/projects", json={"project": {"name": "locked"}})
            finished.append("post")

        writer = threading.Thread(target=create)
        writer.start()
        server.wait_for_log(LOCKED)  # the POST waits for the lock now
        listed = api.http.get("/projects")
        finished.append("get")
        writer.join()
        holder.execute("ROLLBACK")
    # The wait for the lock never blocked the server: the GET was answered meanwhile.
    assert finished == ["get", "post"]
    assert server.log().count(LOCKED) == 1  # and the one that waited was the POST
    assert listed.status_code == 200
    post = results["post"]
    assert post.status_code == 503, post.text
    assert int(post.headers["retry-after"]) >= 1
    assert post.json()["code"] and post.json()["message"]

    # Nothing of the refused request was written; the next one works; the file is sound.
    names = [p["name"] for p in api.http.get("/projects").json()["projects"]]
    assert names == ["before-the-lock"]
    api.create_ready_project(name="after-the-lock")
    with sqlite3.connect(server.data_dir / "pgplane.db") as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- the data disk full during a branch copy -------------------------------------------------


# The parent: ~35 MB of table (and as much WAL); with the ~50 MB of a new cluster it takes ~120
# MB, so on a 200 MB disk its copy (~100 MB) does not fit.
PARENT_ROWS = 75000
PARENT_SUM = PARENT_ROWS * (PARENT_ROWS + 1) // 2
SMALL_DISK = "200m"


@contextlib.contextmanager
def small_disk_server(**env: str) -> Iterator[Server]:
    """A server whose projects live on a 200 MB filesystem of their own (a tmpfs; needs root),
    which copies rather than clones: without a disk share each (on a project's own XFS a branch
    is a clone, and never fills it)."""
    mounted: list[Path] = []

    def prepare(data_dir: Path) -> None:
        projects = data_dir / "projects"
        projects.mkdir(mode=0o711)
        options = f"size={SMALL_DISK},mode=0711"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(projects)], check=True)
        mounted.append(projects)

    try:
        with running_server(
            prepare=prepare,
            PGPLANE_MAX_ATTEMPTS="2",
            PGPLANE_DISK_PER_PROJECT="0",
            **ENV,
            **env,
        ) as server:
            yield server
    finally:
        for path in mounted:
            subprocess.run(["umount", "-l", str(path)], check=False)
            shutil.rmtree(path.parent, ignore_errors=True)


def _tree_bytes(path: Path) -> int:
    """What the tree holds, its data directories' pg_wal aside: Postgres keeps up to
    min_wal_size (80 MB) there as it sees fit, recycled segments included."""
    return sum(
        f.lstat().st_size for f in path.rglob("*") if f.is_file() and "pg_wal" not in f.parts
    )


WAL_KEPT = 80 << 20  # min_wal_size: what Postgres may keep in pg_wal however little it wrote


def _a_branch_that_does_not_fit_fails_cleanly(server: Server) -> str:
    """Fill a parent, branch it, and check what a branch that does not fit must leave: its
    operation failed (after its two attempts) with the reason, the parent running with every
    row and writable, no partial copy, the space back. Returns the operation's error."""
    with Api(server, server.create_key("full@x.io")[1]) as api:
        # No history: its archive and base states would take the small disk before the copy.
        body = api.create_ready_project(name="full", history_retention_seconds=0)
        pid = body["project"]["id"]
        uri = body["connection_uris"][0]["connection_uri"]
        with _connect(uri) as conn:
            conn.execute("CREATE TABLE t AS SELECT g AS v, repeat('x', 400) AS pad"
                         " FROM generate_series(1, %s) g", [PARENT_ROWS])  # fmt: skip
        project_dir = server.data_dir / "projects" / pid
        bytes_before = _tree_bytes(project_dir)
        disk_before = shutil.disk_usage(project_dir).used

        r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "too-big"}})
        assert r.status_code == 201, r.text
        op_ids = [o["id"] for o in r.json()["operations"]]
        ops = api.wait_operations(pid, op_ids, timeout=120)
        assert [o["status"] for o in ops] == ["failed"], ops
        assert "No space left on device" in ops[0]["error"], ops[0]
        assert ops[0]["failures_count"] == 2

        # The parent never stopped and lost nothing; the space is back; nothing half-made.
        with _connect(uri) as conn:
            row = conn.execute("SELECT count(*), sum(v) FROM t").fetchone()
            assert row == (PARENT_ROWS, PARENT_SUM)
            conn.execute("INSERT INTO t VALUES (0, 'still writable')")
        assert list(project_dir.glob("branches/*/pgdata.tmp")) == []
        # What the project holds on disk: its parent and what the parent wrote since (WAL).
        assert _tree_bytes(project_dir) <= bytes_before + (32 << 20)
        if project_dir.parent.is_mount():  # a disk of its own: nothing else writes to it
            assert shutil.disk_usage(project_dir).used <= disk_before + WAL_KEPT
        assert len(postmasters(server.data_dir)) == 1
        others = [o for o in api.operations(pid) if o["id"] not in op_ids]
        assert [o["status"] for o in others] == ["finished"] * len(others), others
        return str(ops[0]["error"])


def test_a_branch_the_disk_reserve_refuses_fails_cleanly_and_the_parent_goes_on() -> None:
    """Any user: the reserve is the whole disk, so the check before the copy refuses it without
    writing anything, however much the tests beside this one free meanwhile (a reserve of all
    but 20 MB of the free space was met once another process freed more)."""
    total = shutil.disk_usage(tempfile.gettempdir()).total
    with running_server(
        PGPLANE_DISK_RESERVE_BYTES=str(total), PGPLANE_MAX_ATTEMPTS="2", **ENV
    ) as server:
        error = _a_branch_that_does_not_fit_fails_cleanly(server)
    assert "not enough free disk space" in error


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_a_branch_copy_that_fills_a_real_disk_fails_cleanly_as_root() -> None:
    """The check before the copy is off (a negative reserve): the copy itself meets ENOSPC."""
    with small_disk_server(PGPLANE_DISK_RESERVE_BYTES="-1") as server:
        error = _a_branch_that_does_not_fit_fails_cleanly(server)
    assert "Errno 28" in error and "not enough free disk space" not in error


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small filesystem needs root")
def test_the_default_reserve_is_5_percent_of_the_disk_as_root() -> None:
    """Unconfigured, the check before a copy keeps 5% of the disk free: 10 MB of the 200 MB
    (the 1 GiB cap of larger disks: tests/unit/test_disk_reserve.py)."""
    with small_disk_server() as server:
        error = _a_branch_that_does_not_fit_fails_cleanly(server)
    assert "not enough free disk space" in error and "10 MB must stay free" in error, error


def test_writes_racing_a_lock_holder_are_done_or_503_never_half(api: Api) -> None:
    """Every answer is done (200) or a 503 with the error body, and only the done ones exist."""
    server = api.server
    statuses: list[int] = []
    stop = threading.Event()

    def hammer() -> None:
        with httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {api.key}"}, timeout=30
        ) as http:
            while not stop.is_set():
                r = http.post("/api_keys", json={"key_name": "racing"})
                statuses.append(r.status_code)
                if r.status_code >= 500:
                    assert r.json()["code"], r.text

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    with sqlite3.connect(server.data_dir / "pgplane.db", isolation_level=None) as holder:
        wait_for("requests answered before the lock", lambda: 200 in statuses)
        holder.execute("BEGIN IMMEDIATE")
        # Held until a request has waited out BUSY_SECONDS and been refused: the platform's own
        # writers (a key's use flushed, the scheduler) queue for the store too, and one of them
        # may be the one that waits the first BUSY_SECONDS, so a fixed hold is not enough.
        wait_for("a request refused while the store is locked", lambda: 503 in statuses,
                 BUSY_SECONDS * 6)  # fmt: skip
        holder.execute("ROLLBACK")
        released = len(statuses)
        wait_for("a request answered after it", lambda: 200 in statuses[released:])
    stop.set()
    for t in threads:
        t.join()
    assert set(statuses) == {200, 503}, statuses
    listed = api.http.get("/api_keys").json()
    assert len([k for k in listed if k["name"] == "racing"]) == statuses.count(200)
