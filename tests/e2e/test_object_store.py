"""The platform kept in a real S3-compatible store (SeaweedFS) and brought back from it alone:
a project with rows and a snapshot; the server and every compute killed and the whole data
directory deleted, as a lost machine's; `pgplane recover` into a new directory; `serve` there.
The old key lists the project, its connection string and password are the same, the proxy's
certificate authority is the same, every row committed 5 s before the loss is there, and the
snapshot restores.

The object store frozen for a while under writes: the compute serves throughout, and the
shipping catches up by itself. The server killed inside an upload: the branch's history
converges to whole after the restart, with nothing stored that its head does not name.

Also what keeps two platforms off one prefix: `serve` on an empty data directory over a prefix
that holds a platform is refused, naming `pgplane recover`; `recover` with another archive key
is refused by name and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from pgplane.compute.local.cold.manifest import ARCHIVE_NAME, MANIFEST_NAME
from pgplane.compute.local.history import wal
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.postgres.sessions import ADMIN_USER, conninfo
from pgplane.compute.local.shared import receiver, shipping, streaming
from pgplane.compute.local.shared.objects import DirectoryStore, Written
from pgplane.compute.local.shared.s3 import S3Store, parse_url
from pgplane.compute.local.shared.sealed import SealedStore
from pgplane.compute.local.tenants.users import remove_project_users
from pgplane.core import clock
from tests.console import PASSWORD, Browser
from tests.objectstore import SeaweedFS
from tests.support import (
    PGPLANE,
    Api,
    Server,
    free_port,
    make_data_dir,
    postmaster_pid,
    remove_in_background,
    run_cli,
    server_env,
    stop_postmasters,
    unmount_volumes,
    wait_for,
)

# The shipping and store copies as often as the defaults with an object store (1 s), the
# scheduler and retries quick for the test's sake, and a lost platform's lease on its prefix
# over in 5 s, not 20 (what a recovery waits for first).
ENV = {
    "PGPLANE_SCHEDULER_SECONDS": "0.5",
    "PGPLANE_RETRY_BASE_SECONDS": "0.2",
    "PGPLANE_NODE_LEASE_SECONDS": "5",
    "PGPLANE_NODE_HEARTBEAT_SECONDS": "1",
}
# For the tests of what happens to whole segments: one completed every 2 s.
_QUICK_SEGMENTS = {"PGPLANE_OBJECT_ARCHIVE_TIMEOUT_SECONDS": "2"}
# What the platform promises of a lost machine: commits older than this are in the bucket.
RPO_SECONDS = 5.0
# How long the object store stops answering (frozen, its connections open) while writes go on:
# ten seconds in every run, a minute in the slow variant (run before resolving).
OUTAGES = [10.0, pytest.param(60.0, marks=pytest.mark.slow, id="a-minute-out")]


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedFS]:
    directory = Path(tempfile.mkdtemp(prefix="pgplane-test-s3-"))
    server = SeaweedFS(directory)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "archive.key"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def _env(seaweed: SeaweedFS, prefix: str, key_file: Path) -> dict[str, str]:
    return server_env(
        **ENV,
        **seaweed.env(),
        PGPLANE_OBJECT_STORE=seaweed.url(prefix),
        PGPLANE_ARCHIVE_KEY_FILE=str(key_file),
    )


@contextlib.contextmanager
def _machine(env: dict[str, str], logs: Path, proxy_port: int | None = None) -> Iterator[Server]:
    """A server on a data directory of its own, its log kept outside it (the directory is
    deleted when the machine is lost); everything it left stopped and removed after."""
    data_dir = make_data_dir()
    server = Server(
        data_dir=data_dir,
        port=free_port(),
        env=env,
        log_path=logs / f"serve-{data_dir.name}.log",
        proxy_port=proxy_port or free_port(),
    )
    try:
        yield server
    finally:
        server.stop()
        server.close_clients()
        _lose(data_dir)


def _lose(data_dir: Path) -> None:
    """What a machine's loss takes: its computes (killed, not stopped), its users, its disk."""
    if not data_dir.exists():
        return
    for pgdata in data_dir.glob("projects/*/branches/*/pgdata*"):
        pid = postmaster_pid(data_dir, pgdata)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    stop_postmasters(data_dir)
    remove_project_users(data_dir)
    unmount_volumes(data_dir)
    remove_in_background(data_dir)


def _rows(uri: str) -> tuple[int, int]:
    with psycopg.connect(uri, connect_timeout=60) as conn:
        row = conn.execute("SELECT count(*), coalesce(max(v), 0) FROM t").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _uri(api: Api, project_id: str, branch_id: str | None = None) -> str:
    params = {"role_name": "neondb_owner", "database_name": "neondb"}
    if branch_id is not None:
        params["branch_id"] = branch_id
    r = api.http.get(f"/projects/{project_id}/connection_uri", params=params)
    assert r.status_code == 200, r.text
    return str(r.json()["uri"])


def _write_until_the_loss(uri: str, seaweed: SeaweedFS, outage: float) -> int:
    """Rows 1001-1500 at once, then one every 50 ms: for ``outage`` seconds with the object store
    frozen (the compute serves throughout), two seconds once it is back, then ``RPO_SECONDS``
    more up to the loss. The value of the last row the promise covers (committed that long
    before the loss): the shipping caught up after the outage, with nothing lost."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("INSERT INTO t SELECT g, 'y' FROM generate_series(1001, 1500) g")
        v = 1500
        seaweed.pause()
        try:
            for i, seconds in enumerate((outage, 2.0, RPO_SECONDS)):
                if i > 0:
                    seaweed.resume()
                promised = v
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    v += 1
                    conn.execute("INSERT INTO t VALUES (%s, 'late')", (v,))
                    time.sleep(0.05)
        finally:
            seaweed.resume()
    return promised


def _admin_conninfo(server: Server, name: str) -> str:
    """A new project's running compute, reached on its own socket as the platform's
    superuser (a replication client, as the platform's receivers are)."""
    with Api(server, server.create_key(f"{name}@example.com")[1]) as api:
        body = api.create_ready_project(name=name)
    layout = Layout(server.data_dir.resolve())
    pgdata = layout.pgdata(body["project"]["id"], body["branch"]["id"])
    running = Records(layout.postmaster_records).get(pgdata)
    assert running is not None
    return conninfo(running.socket_dir, running.port, user=ADMIN_USER)


def _head(
    seaweed: SeaweedFS, prefix: str, key_file: Path, project_id: str, branch_id: str
) -> shipping.Head:
    """The branch's head in the bucket, as it is now (an empty one when there is none)."""
    client = seaweed.client()
    try:
        sealed = SealedStore(
            S3Store(*parse_url(seaweed.url(prefix)), client), key_file.read_bytes()
        )
        head = shipping.read_head(sealed, shipping.prefix_of(project_id, branch_id))
    finally:
        client.close()
    return head or shipping.Head(format=1, bases=(), wal={})


def _one(conn: psycopg.Connection, query: str) -> object:
    row = conn.execute(query).fetchone()
    return None if row is None else row[0]


def _metric(server: Server, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def _recovered(server: Server, branch_id: str, snapshot_id: str) -> None:
    """`pgplane recover` into the server's directory, reporting the branch and the snapshot."""
    done = run_cli("recover", data_dir=server.data_dir, env=server.env)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert [b["branch_id"] for b in report["branches"]] == [branch_id]
    assert report["branches"][0]["recovered_to"], report
    assert report["not_recovered"] == []
    assert [s["snapshot_id"] for s in report["snapshots"]] == [snapshot_id]


def _snapshot_restores(api: Api, pid: str, snapshot_id: str, rows: tuple[int, int]) -> None:
    """The snapshot restored as a new branch, with a compute of its own, holds ``rows``."""
    r = api.http.post(f"/projects/{pid}/snapshots/{snapshot_id}/restore", json={"name": "back"})
    branch = api.settled(pid, r)["branch"]["id"]
    r = api.http.post(
        f"/projects/{pid}/endpoints",
        json={"endpoint": {"branch_id": branch, "type": "read_write"}},
    )
    api.settled(pid, r)
    assert _rows(_uri(api, pid, branch)) == rows


def _backups_restore(server: Server, branch_id: str) -> None:
    """What the bucket holds now is restorable (checked beside the running platform)."""
    checked = run_cli("backups", "verify", data_dir=server.data_dir, env=server.env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rows = json.loads(checked.stdout)["branches"]
    assert [(r["branch_id"], r["error"]) for r in rows] == [(branch_id, None)], rows
    assert rows[0]["restorable_to"]
    assert not any((server.data_dir / "scratch").iterdir())  # the scratch copy is gone


def _recover_killed_at(failpoint: str, data_dir: Path, env: dict[str, str], logs: Path) -> None:
    log_path = logs / f"recover-{data_dir.name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [*PGPLANE, "recover", "--data-dir", str(data_dir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**env, "PGPLANE_FAILPOINTS": failpoint},
        )
    try:
        wait_for(
            f"recover to reach {failpoint}",
            lambda: f"failpoint {failpoint} reached" in log_path.read_text(errors="replace"),
            180,
        )
    finally:
        proc.kill()
        proc.wait()


def _no_credential_reaches_a_compute(server: Server, seaweed: SeaweedFS) -> None:
    """Nothing of the store's credentials or the archive key in a compute's environment, which
    its tenant reads (it may hold the compute's OS user)."""
    pgdatas = list(server.data_dir.glob("projects/*/branches/*/pgdata"))
    pids = [pid for p in pgdatas if (pid := postmaster_pid(server.data_dir, p)) is not None]
    assert pids
    for pid in pids:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
        assert seaweed.secret_key.encode() not in environ
        assert b"AWS_" not in environ and b"ARCHIVE_KEY" not in environ


@pytest.mark.parametrize("outage", OUTAGES)
def test_a_lost_machine_s_platform_comes_back_from_the_bucket_alone(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path, outage: float
) -> None:
    env = _env(seaweed, f"lost-{outage:.0f}", key_file)
    with _machine(env, tmp_path) as first:
        first.start()
        assert "this disk only" not in first.log()
        _, key = first.create_key("lost@example.com")
        api = Api(first, key)
        body = api.create_ready_project(name="outlives-its-machine")
        pid, main = body["project"]["id"], body["branch"]["id"]
        uri = _uri(api, pid)
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int PRIMARY KEY, pad text)")
            conn.execute("INSERT INTO t SELECT g, repeat('x', 100) FROM generate_series(1, 1000) g")
        r = api.http.post(f"/projects/{pid}/branches/{main}/snapshot", params={"name": "before"})
        snapshot = api.settled(pid, r)["snapshot"]
        _no_credential_reaches_a_compute(first, seaweed)
        # Operators see the shipping: files stored, the store copied moments ago.
        wait_for("a file shipped", lambda: _metric(first, "pgplane_archive_shipped_files_total"))
        assert _metric(first, "pgplane_store_copy_age_seconds") < 30
        promised = _write_until_the_loss(uri, seaweed, outage)
        authority = (first.data_dir / "tls" / "ca.crt").read_bytes()
        api.http.close()
        first.stop(signal.SIGKILL)
        lost_dir = first.data_dir
        _lose(lost_dir)
        proxy_port = first.proxy_port

    with _machine(env, tmp_path, proxy_port=proxy_port) as second:
        # A recovery killed midway (a project rebuilt, the store's queued work not yet run):
        # serve refuses the directory, and recover run again goes on from it.
        _recover_killed_at("recover:project_rebuilt", second.data_dir, env, tmp_path)
        with pytest.raises(RuntimeError, match="did not finish"):
            second.start()
        _recovered(second, main, snapshot["id"])
        second.start()
        # The proxy's certificates are of the authority its clients trust already.
        assert (second.data_dir / "tls" / "ca.crt").read_bytes() == authority
        api = Api(second, key)  # the old key
        r = api.http.get("/projects")
        assert [p["id"] for p in r.json()["projects"]] == [pid], r.text
        attach = [o for o in api.operations(pid) if o["action"] == "tenant_attach"]
        api.wait_operations(pid, [o["id"] for o in attach])
        assert _uri(api, pid) == uri  # the same string: host, endpoint and password
        count, newest = _rows(uri)
        assert newest >= promised, (newest, promised)
        assert count == newest  # every row up to the last one there, none missing

        _backups_restore(second, main)

        _snapshot_restores(api, pid, snapshot["id"], (1000, 1000))
        api.http.close()


def test_in_synchronous_mode_no_acknowledged_commit_is_lost_with_the_machine(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """With --archive-sync, a commit is acknowledged only once its WAL is in the bucket: rows
    committed one after another until the very moment the server and the compute are killed
    are all back after `recover`, the last one included (asynchronous mode may lose the last
    half second). Nor is one acknowledged before its branch has a base state there (its
    WAL alone rebuilds nothing): the first one's shipping is held up here."""
    env = {**_env(seaweed, "synchronous", key_file), "PGPLANE_ARCHIVE_SYNC": "on"}
    held = {**env, "PGPLANE_FAILPOINTS": "ship:base_stored=1*sleep(4000)"}
    with _machine(held, tmp_path) as first:
        first.start()
        _, key = first.create_key("sync@example.com")
        with Api(first, key) as api:
            body = api.create_ready_project(name="synchronous")
            pid, main = body["project"]["id"], body["branch"]["id"]
            uri = _uri(api, pid)
        with psycopg.connect(uri, autocommit=True) as conn:
            setting = conn.execute("SHOW synchronous_standby_names").fetchone()
            assert setting == (receiver.STANDBY_NAME,), setting
            conn.execute("CREATE TABLE t (v int PRIMARY KEY, pad text)")
            assert _head(seaweed, "synchronous", key_file, pid, main).bases
            acknowledged = 0
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                conn.execute("INSERT INTO t VALUES (%s, 'x')", (acknowledged + 1,))
                acknowledged += 1
            first.stop(signal.SIGKILL)
            _lose(first.data_dir)
        proxy_port = first.proxy_port

    with _machine(env, tmp_path, proxy_port=proxy_port) as second:
        done = run_cli("recover", data_dir=second.data_dir, env=second.env)
        assert done.returncode == 0, done.stdout + done.stderr
        second.start()
        with Api(second, key) as api:
            attach = [o for o in api.operations(pid) if o["action"] == "tenant_attach"]
            api.wait_operations(pid, [o["id"] for o in attach])
            assert _uri(api, pid) == uri
        assert acknowledged > 10
        assert _rows(uri) == (acknowledged, acknowledged)
        assert main


def test_a_stream_whose_wal_the_compute_removed_ends_and_says_why(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """A receiver that falls behind a bulk load (its WAL recycled by a checkpoint meanwhile)
    starts again where the bucket's copy ends, which the compute may no longer hold: that
    receiver ends at once, saying why (the next round starts another past it, once the
    segments are shipped whole). It waited for ever on the compute's error, which libpq held
    already, and every synchronous commit with it."""
    with _machine(_env(seaweed, "removed", key_file), tmp_path) as server:
        server.start()
        info = _admin_conninfo(server, "removed")
        with psycopg.connect(info, autocommit=True) as conn:  # the first segments recycled
            conn.execute("CREATE TABLE public.filler (v int)")
            for _ in range(4):
                conn.execute("INSERT INTO public.filler VALUES (1)")
                conn.execute("SELECT pg_catalog.pg_switch_wal()")
            # Once the platform's own receiver has taken them (its slot holds them till then).
            taken = (
                "SELECT bool_and(restart_lsn >= pg_catalog.pg_current_wal_lsn())"
                " FROM pg_catalog.pg_replication_slots"
            )
            wait_for("the platform's receiver past the switches", lambda: _one(conn, taken))
            conn.execute("CHECKPOINT")
        stream = receiver.Receiver(
            store=DirectoryStore(tmp_path / "bucket"),
            prefix="history/p/b",
            conninfo=info,
            synchronous=True,
            shipped=lambda: ["000000010000000000000001"],  # the bucket's copy ends at 0/2000000
            based=lambda: True,
        )
        stream.start()
        stream.join(timeout=30)
        assert not stream.is_alive(), "the stream waits for WAL the compute removed"
        assert stream.error is not None
        assert "has already been removed" in stream.error, stream.error


class _Stalled(DirectoryStore):
    """A store whose writes wait until it is let go, as a slow one's do."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked = threading.Event()
        self.going = threading.Event()

    def write_bytes(self, key: str, data: bytes, *, replace: bool = True) -> Written:
        self.asked.set()
        self.going.wait(60)
        return super().write_bytes(key, data, replace=replace)


def test_a_receiver_behind_a_bulk_load_keeps_its_place_with_its_slot(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """A receiver whose store is slow falls behind; the checkpoints meanwhile would recycle
    the WAL it has not taken yet. Its temporary slot keeps that WAL on the compute, so once the
    store takes writes again it goes on from where it was, nothing skipped."""
    with _machine(_env(seaweed, "behind", key_file), tmp_path) as server:
        server.start()
        info = _admin_conninfo(server, "behind")
        store = _Stalled(tmp_path / "bucket")
        stream = receiver.Receiver(
            store=store,
            prefix="history/p/b",
            conninfo=info,
            synchronous=False,
            shipped=list,
            based=lambda: True,
        )
        stream.start()
        try:
            with psycopg.connect(info, autocommit=True) as conn:
                assert conn.execute("SHOW max_slot_wal_keep_size").fetchone() == ("1GB",)
                conn.execute("CREATE TABLE public.filler (v int)")
                conn.execute("INSERT INTO public.filler VALUES (1)")
                assert store.asked.wait(30), "the receiver stored nothing"
                slots = "SELECT slot_type, temporary, active FROM pg_catalog.pg_replication_slots"
                wait_for(  # the platform's own receiver's, and this one's
                    "a temporary slot for each receiver",
                    lambda: conn.execute(slots).fetchall() == [("physical", True, True)] * 2,
                )
                for _ in range(4):  # segments the stalled receiver has not taken
                    conn.execute(
                        "INSERT INTO public.filler SELECT g FROM generate_series(1, 50000) g"
                    )
                    conn.execute("SELECT pg_catalog.pg_switch_wal()")
                (end,) = conn.execute("SELECT pg_catalog.pg_current_wal_lsn()::text").fetchone()
                # Recycled but for this receiver's slot, once the platform's own has them.
                taken = (
                    "SELECT max(restart_lsn) >= pg_catalog.pg_current_wal_lsn()"
                    " FROM pg_catalog.pg_replication_slots"
                )
                wait_for("the platform's receiver past the switches", lambda: _one(conn, taken))
                conn.execute("CHECKPOINT")
            store.going.set()
            wait_for(
                "the receiver past the bulk load",
                lambda: not stream.is_alive() or stream.stored >= wal.parse_lsn(end),
                60,
            )
            assert stream.is_alive(), stream.error
        finally:
            store.going.set()
            stream.stopping.set()
            stream.join(timeout=10)


def test_a_prefix_is_one_platform_s_and_its_key_is_checked(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    env = _env(seaweed, "claimed", key_file)
    with _machine(env, tmp_path) as owner, _machine(env, tmp_path) as other:
        owner.start()
        with pytest.raises(RuntimeError, match="pgplane recover"):
            other.start()  # an empty data directory over a platform's prefix
        owner.stop()
        done = run_cli("recover", data_dir=other.data_dir, env=other.env)
        assert done.returncode == 0, done.stdout + done.stderr  # the refused one, as it says
        wrong = tmp_path / "wrong.key"
        wrong.write_bytes(os.urandom(32))
        wrong.chmod(0o600)
        with _machine({**env, "PGPLANE_ARCHIVE_KEY_FILE": str(wrong)}, tmp_path) as thief:
            done = run_cli("recover", data_dir=thief.data_dir, env=thief.env)
            assert done.returncode == 2, done.stdout + done.stderr
            assert "archive key is not the one" in done.stderr
            assert not (thief.data_dir / "pgplane.db").exists()


def test_a_restart_while_the_store_is_down_serves_and_ships_once_it_is_back(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """A restart must not keep the computes' clients out because the bucket is away: serve
    starts, says so, serves the API and the compute, and writes nothing there until the store
    answers; then it claims the prefix and ships what waited."""
    env = _env(seaweed, "restarted", key_file)
    with _machine(env, tmp_path) as server:
        server.start()
        _, key = server.create_key("restart@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="restarted")
            pid = body["project"]["id"]
            uri = _uri(api, pid)
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int PRIMARY KEY, pad text)")
        server.stop()
        seaweed.pause()
        try:
            server.start()
            assert "nothing written there until it answers" in server.log()
            with Api(server, key) as api:
                r = api.http.get("/projects")
                assert [p["id"] for p in r.json()["projects"]] == [pid], r.text
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("INSERT INTO t SELECT g, 'x' FROM generate_series(1, 1000) g")
        finally:
            seaweed.resume()
        server.wait_for_log("object store prefix claimed", timeout=120)
        wait_for(
            "what waited shipped",
            lambda: (
                _metric(server, "pgplane_archive_shipped_files_total") > 0
                and _metric(server, "pgplane_archive_unshipped_bytes") == 0
            ),
            120,
        )


def test_a_bucket_past_its_quota_refuses_and_shipping_resumes_once_it_is_lifted(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """SeaweedFS enforces a bucket's quota by making the bucket read-only (its writes then fail
    with an InternalError). The compute serves throughout, the failures are counted and logged
    in the store's own words, and shipping resumes by itself once the quota is lifted."""
    bucket = "pgplane-quota"
    client = seaweed.client()
    try:
        client.create_bucket(Bucket=bucket)
    finally:
        client.close()
    env = {**_env(seaweed, "", key_file), "PGPLANE_OBJECT_STORE": f"s3://{bucket}/quota"}
    with _machine(env, tmp_path) as server:
        server.start()
        _, key = server.create_key("quota@example.com")
        with Api(server, key) as api:
            pid = api.create_ready_project(name="over-quota")["project"]["id"]
            uri = _uri(api, pid)
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int PRIMARY KEY, pad text)")
        wait_for(
            "the first shipping", lambda: _metric(server, "pgplane_archive_unshipped_bytes") == 0
        )
        seaweed.over_quota(bucket, size_mb=1)  # the first base state alone is past it
        try:
            failed = _metric(server, "pgplane_archive_ship_failures_total")
            with psycopg.connect(uri, autocommit=True) as conn:
                # Past a segment of WAL: a whole one archived here waits for the store.
                rows = 100_000
                conn.execute(
                    "INSERT INTO t SELECT g, repeat(md5(g::text), 4) FROM generate_series(1, %s) g",
                    (rows,),
                )
                # Refused in the store's own words, naming the object: a WAL file, or the base
                # state due first (one is taken every 10 s with an object store, and nothing
                # after a refused object is shipped in its round).
                refused = (
                    rf"history of {pid}/\S+ not shipped: s3 put \S+/(wal|base)/0\S+: InternalError"
                )
                wait_for(
                    "a refused upload counted and logged, a segment waiting here",
                    lambda: (
                        _metric(server, "pgplane_archive_ship_failures_total") > failed
                        and _metric(server, "pgplane_archive_unshipped_bytes") > 0
                        and re.search(refused, server.log())
                    ),
                    60,
                    server=server,
                )
                conn.execute("INSERT INTO t VALUES (%s, 'served while refused')", (rows + 1,))
                assert conn.execute("SELECT count(*) FROM t").fetchone() == (rows + 1,)
        finally:
            seaweed.quota_lifted(bucket)
        wait_for(
            "what waited shipped",
            lambda: _metric(server, "pgplane_archive_unshipped_bytes") == 0,
            120,
        )


@pytest.mark.parametrize("failpoint", ["ship:base_stored", "ship:wal_stored"])
def test_a_kill_inside_an_upload_converges(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path, failpoint: str
) -> None:
    """The server killed with an object stored that its branch's head does not name yet: after
    the restart the head names the branch's whole history here, and the bucket holds nothing
    under the branch that the head does not name."""
    url = seaweed.url("killed-" + failpoint.partition(":")[2].replace("_", "-"))
    # Segments completed every 2 s (the stream makes 60 the default): one is shipped soon.
    env = {**_env(seaweed, url.rpartition("/")[2], key_file), **_QUICK_SEGMENTS}
    with _machine({**env, "PGPLANE_FAILPOINTS": f"{failpoint}=1*wait"}, tmp_path) as server:
        server.start()
        _, key = server.create_key("killed-upload@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="killed-upload")
        with psycopg.connect(body["connection_uris"][0]["connection_uri"]) as conn:
            conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g")
        server.wait_for_log(f"failpoint {failpoint} reached")
        server.stop(signal.SIGKILL)
        del server.env["PGPLANE_FAILPOINTS"]
        server.start()
        pid, branch = body["project"]["id"], body["branch"]["id"]
        wal = server.data_dir / "projects" / pid / "branches" / branch / "wal"
        client = seaweed.client()
        try:
            raw = S3Store(*parse_url(url), client)
            sealed = SealedStore(raw, key_file.read_bytes())
            prefix = shipping.prefix_of(pid, branch)

            def converged() -> bool:
                head = shipping.read_head(sealed, prefix)
                if head is None or not head.bases:
                    return False
                here = {n for n in os.listdir(wal) if not n.startswith(".")}
                named = {f"{prefix}/{shipping.HEAD}", *(f"{prefix}/wal/{n}" for n in head.wal)}
                for base in head.bases:
                    named |= {f"{prefix}/base/{base}/{n}" for n in (ARCHIVE_NAME, MANIFEST_NAME)}
                # Besides, the WAL streamed past the newest segment shipped whole.
                end = max((n[8:] for n in head.wal if not n.endswith(".history")), default="")
                stored = {k for k in raw.sizes(prefix) if not streaming.live(k, prefix, end)}
                return here <= set(head.wal) and stored == named

            wait_for("the branch's history shipped whole, and nothing else", converged, 60)
        finally:
            client.close()


def test_a_tenants_forged_archive_uploads_nothing_and_stalls_nothing(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """A tenant holding its compute's OS user plants, in its branch's WAL archive, a link to
    another project's file, a FIFO and a sparse file of 2 GiB, each named like a segment: none
    is uploaded (nor read: the huge one is refused by its size), the rounds go on shipping the
    real segments, and nothing lands under the prefix but the platform's own objects."""
    url = seaweed.url("forged")
    with _machine({**_env(seaweed, "forged", key_file), **_QUICK_SEGMENTS}, tmp_path) as server:
        server.start()
        _, key = server.create_key("forged@example.com")
        with Api(server, key) as api:
            tenant = api.create_ready_project(name="tenant")
            victim = api.create_ready_project(name="victim")
        pid, branch = tenant["project"]["id"], tenant["branch"]["id"]
        vid, vbranch = victim["project"]["id"], victim["branch"]["id"]
        user = pwd.getpwnam(f"pgp-{pid}")
        wal = server.data_dir / "projects" / pid / "branches" / branch / "wal"
        secret = server.data_dir / "projects" / vid / "branches" / vbranch / "pgdata" / "PG_VERSION"
        link, fifo, huge = (wal / f"0000000100000000000000F{n}" for n in range(3))
        os.symlink(secret, link)
        os.mkfifo(fifo, 0o600)
        with huge.open("wb") as f:
            f.truncate(2 << 30)
        for planted in (link, fifo, huge):
            os.lchown(planted, user.pw_uid, user.pw_gid)

        with psycopg.connect(tenant["connection_uris"][0]["connection_uri"]) as conn:
            conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 1000) g")
            row = conn.execute("SELECT pg_walfile_name(pg_current_wal_insert_lsn())").fetchone()
        segment = str(row[0]) if row else ""
        client = seaweed.client()
        try:
            raw = S3Store(*parse_url(url), client)
            sealed = SealedStore(raw, key_file.read_bytes())
            prefix = shipping.prefix_of(pid, branch)

            def shipped() -> set[str]:
                head = shipping.read_head(sealed, prefix)
                return set() if head is None else set(head.wal)

            wait_for(f"{segment} shipped after the plant", lambda: segment in shipped(), 60)
            # Completed early by the round, then shipped: its zero tail is freed on the disk,
            # its bytes the same (the checksum shipped is the catalog's).
            st = os.lstat(wal / segment)
            assert st.st_size == 16 << 20 and st.st_blocks * 512 < 8 << 20, st
            keys = list(raw.sizes(prefix))
            for planted in (link, fifo, huge):
                assert planted.name not in shipped()
                assert f"{prefix}/wal/{planted.name}" not in keys
            # Under the prefix, only the platform's own objects; history only of the two.
            listed = client.list_objects_v2(Bucket=seaweed.bucket, Prefix="forged/")
            everything = [o["Key"].removeprefix("forged/") for o in listed.get("Contents", [])]
            assert {k.split("/", 1)[0] for k in everything} <= {
                *("platform.json", "lease.json", "pgplane-storage.id"),
                *("store", "history", "snapshots", "archive"),
            }, everything
            assert {k.split("/")[1] for k in everything if k.startswith("history/")} <= {pid, vid}
        finally:
            client.close()
        assert server.log().count(f"{link.name} of {wal} is not a plain file") == 1
        assert f"{huge.name} of {wal} is larger than" in server.log()
        assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=10).status_code == 200


def test_users_and_operators_see_the_archive_and_its_weekly_check(
    seaweed: SeaweedFS, key_file: Path, tmp_path: Path
) -> None:
    """With the check's week shortened to seconds: the platform proves each branch's backup
    restores by itself, says so in /metrics and the console; the console shows when each
    branch was last archived and what its objects take; the project's synthetic storage size
    and consumption count them."""
    env = {
        **_env(seaweed, "seen", key_file),
        "PGPLANE_BACKUP_VERIFY_SECONDS": "3",
        "PGPLANE_USAGE_SECONDS": "0.5",
    }
    with _machine(env, tmp_path) as server:
        server.start()
        done = run_cli(
            "accounts", "create", "seen@example.com", "--password-stdin",
            data_dir=server.data_dir, env=server.env, stdin=PASSWORD,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        with Browser(server) as browser:
            assert browser.sign_in("seen@example.com").status_code == 303
            api = Api(server, browser.create_key("archive"))
            body = api.create_ready_project(name="archived")
            pid = body["project"]["id"]
            with psycopg.connect(_uri(api, pid), autocommit=True) as conn:
                conn.execute("CREATE TABLE t AS SELECT g FROM generate_series(1, 10000) g")
            # A check that passed: one run the moment the project was made may find its
            # first base state not shipped yet (the next, 3 s later, finds it).
            wait_for(
                "the platform's own check of the branch's backup, passed",
                lambda: (
                    _metric(server, "pgplane_backup_verify_last_run_timestamp_seconds") > 0
                    and _metric(server, "pgplane_backup_verify_failed_branches") == 0
                ),
                120,
            )

            def backups() -> str:
                page = browser.get(f"/console/projects/{pid}")
                assert page.status_code == 200, page.text
                found = re.search(r'data-testid="backup-row">(.*?)</tr>', page.text, re.S)
                assert found, page.text
                return found.group(1)

            def shown() -> str | None:
                row = backups()
                return row if "restored to" in row and "not known" not in row else None

            row = wait_for("the branch's archive in the console", shown, 60)
            assert re.search(r"<td>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</td>", row), row
            assert re.search(r"<td>\d+(\.\d)? [KM]iB</td>", row), row

            project = api.http.get(f"/projects/{pid}").json()["project"]
            assert project["synthetic_storage_size"] > 0, project
            now = clock.now_us()
            r = api.http.get(
                "/consumption_history/v2/projects",
                params={
                    "from": clock.format_s(now - 3_600_000_000),
                    "to": clock.format_s(now + 3_600_000_000),
                    "granularity": "hourly",
                    "metrics": "archive_storage_bytes_month",
                    "project_ids": pid,
                },
            )
            assert r.status_code == 200, r.text
            frames = r.json()["projects"][0]["periods"][0]["consumption"]
            names = {m["metric_name"] for f in frames for m in f["metrics"]}
            assert names == {"archive_storage_bytes_month"}, frames
            api.http.close()
