"""The object store: what shipping everything to it costs, how recent what it holds is, and how
long bringing a lost platform back takes. Against a real SeaweedFS (``tests/objectstore.py``).

Four measurements, in one run:

- **cost**: pgbench's write-heavy TPC-B (the bundled pgbench, through the proxy) on a project of
  a platform with ``--object-store`` beside one of a platform without, rounds interleaved.
  Target: at least 0.9x the tps;
- **RPO**: while pgbench writes on the first, a marker row committed every half second; the time
  until the WAL segment holding its commit is named in the branch's shipped ``head.json`` (read
  from the bucket, sealed, every 50 ms). Target: p99 at most 5 s;
- **baseline**: before the first platform is lost, its branch copied as an operator would
  without pgplane: ``pg_basebackup -X stream --checkpoint=fast`` (the bundled one) from the
  same running compute into a fresh directory under /tmp, timed, then a postgres (``pg_ctl
  start -w``) on the copy until it accepts connections, timed (the replay of the WAL streamed
  with it: its crash recovery from the backup's checkpoint), then stopped and the copy removed.
  The baseline is the sum of the two. It cannot go through the proxy: a replication login
  there is refused (the platform's ``pg_hba.conf`` has no replication line for tenant roles,
  which are NOREPLICATION anyway), so it connects to the compute's own unix socket (its
  directory and port from the platform's postmaster record, as the tests find them) as the
  platform's superuser ``cloud_admin``, the one role its ``pg_hba.conf`` lets replicate there.
  As root both programs run as the compute's OS user (the owner of its data: Postgres refuses
  root, and the socket directory is that user's);
- **recover**: the first platform lost (server and computes killed), then, once its lease on the
  prefix lapsed (up to 30 s: timed apart), ``pgplane recover`` into a new directory, timed,
  with the branch's size. Target: at most 1.5x the baseline.

The default ``--scale`` 65 makes a branch of ~1 GB (pgbench's ~15 MB a scale unit).

    .venv/bin/python -m bench.object_store [--seconds 20] [--rounds 3] [--scale 65] [--smoke]

``--smoke`` runs each step once, small and short, and checks no target: CI runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import psycopg
from tests.objectstore import SeaweedFS
from tests.support import (
    PGPLANE,
    make_data_dir,
    remove_in_background,
    stop_postmasters,
    unmount_volumes,
)

from bench.common import (
    Api,
    Server,
    median,
    percentile,
    pg_binary,
    plaintext,
    running_server,
    verdict,
)
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records, is_alive
from pgplane.compute.local.postgres.sessions import ADMIN_USER
from pgplane.compute.local.shared import shipping, streaming
from pgplane.compute.local.shared.s3 import S3Store, parse_url
from pgplane.compute.local.shared.sealed import SealedStore
from pgplane.compute.local.tenants.user import postgres_env
from pgplane.compute.local.tenants.users import remove_project_users
from pgplane.objectstore import claim


def _pgbench(uri: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [pg_binary("pgbench", 18), *args, plaintext(uri)],
        capture_output=True,
        text=True,
        check=True,
        timeout=3600,
    )


def _tps(out: str) -> float:
    match = re.search(r"tps = ([\d.]+)", out)
    assert match is not None, out
    return float(match.group(1))


class StoreWatch:
    """Where the branch's WAL in the bucket ends (its shipped segments, then what was streamed
    past them), polled every 50 ms: when each position was first there."""

    def __init__(self, seaweed: SeaweedFS, url: str, key: bytes, prefix: str) -> None:
        self._client = seaweed.client(attempts=3)
        self._store = SealedStore(S3Store(*parse_url(url), self._client), key)
        self._prefix = prefix
        self.ends: list[tuple[float, int]] = []  # (when, the LSN the bucket's copy ends at)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            shipped = shipping.shipped_wal(self._store, self._prefix)
            end = streaming.stored_end(self._store, self._prefix, shipped, 16 << 20)
            self.ends.append((time.monotonic(), end))

    def there_at(self, lsn: int) -> float:
        return next((at for at, end in self.ends if end >= lsn), float("inf"))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


def _markers(uri: str, watch: StoreWatch, count: int) -> list[float]:
    """Seconds from each marker's commit until the bucket held its commit record."""
    commits: list[tuple[float, int]] = []
    with psycopg.connect(plaintext(uri), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS marker (at timestamptz)")
        for _ in range(count):
            conn.execute("INSERT INTO marker VALUES (now())")
            at = time.monotonic()
            row = conn.execute(
                "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8"
            ).fetchone()  # at least the end of the marker's commit record
            assert row is not None
            commits.append((at, int(row[0])))
            time.sleep(0.5)
    deadline = time.monotonic() + 60
    while watch.there_at(max(lsn for _, lsn in commits)) == float("inf"):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    return [watch.there_at(lsn) - at for at, lsn in commits]


def _lose(server: Server) -> None:
    server.stop(signal.SIGKILL)
    stop_postmasters(server.data_dir)
    remove_project_users(server.data_dir)
    unmount_volumes(server.data_dir)


def _latency(out: str) -> float:
    match = re.search(r"latency average = ([\d.]+) ms", out)
    assert match is not None, out
    return float(match.group(1))


def _cpu_seconds(server: Server) -> float:
    """The platform process's CPU time so far, all its threads (not its computes')."""
    assert server.process is not None
    fields = Path(f"/proc/{server.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_cost(
    uris: dict[str, str], servers: dict[str, Server], args: argparse.Namespace
) -> float:
    """pgbench on each side's project, rounds interleaved: four clients (tps), then one (its
    commits' latency). The object store's cost: "on" over "off"; "sync" is the synchronous
    mode's platform. Beside it, the platform's own CPU a transaction with four clients (the
    proxy, and with an object store the receiver and the shipping): on two cores, what it
    takes is the computes' and pgbench's."""
    for u in uris.values():
        _pgbench(u, "-i", "-s", str(args.scale), "-q")
    tps: dict[str, list[float]] = {side: [] for side in uris}
    latency: dict[str, list[float]] = {side: [] for side in uris}
    cpu: dict[str, list[float]] = {side: [] for side in uris}
    for _ in range(args.rounds):
        for side, u in uris.items():
            before = _cpu_seconds(servers[side])
            out = _pgbench(u, "-c", "4", "-j", "2", "-T", str(args.seconds)).stdout
            used = _cpu_seconds(servers[side]) - before
            tps[side].append(_tps(out))
            cpu[side].append(used * 1e6 / (_tps(out) * args.seconds))
            latency[side].append(_latency(_pgbench(u, "-c", "1", "-T", str(args.seconds)).stdout))
    for side in uris:
        print(
            f"pgbench, object store {side:>4}: {median(tps[side]):6.0f} tps with 4 clients"
            f" {tps[side]}, {median(latency[side]):.2f} ms a transaction with 1 {latency[side]};"
            f" the platform's CPU {median(cpu[side]):.0f} us a transaction"
        )
    ratio = median(tps["on"]) / median(tps["off"])
    print(f"shipping's cost: {ratio:.2f}x the tps without (target >= 0.9x)")
    if "sync" in uris:
        print(
            f"synchronous mode: {median(tps['sync']) / median(tps['on']):.2f}x the tps of the"
            f" asynchronous, {median(latency['sync']) / median(latency['on']):.2f}x its latency"
            f" (+{median(latency['sync']) - median(latency['on']):.2f} ms a transaction)"
        )
    return ratio


def measure_rpo(uri: str, watch: StoreWatch, samples: int) -> float:
    seconds = str(samples // 2 + 5)  # the markers' time, and a little more
    load = subprocess.Popen(
        [pg_binary("pgbench", 18), "-c", "4", "-j", "2", "-T", seconds, plaintext(uri)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        rpo = _markers(uri, watch, samples)
    finally:
        load.wait()
        watch.close()
    p50, p99 = percentile(rpo, 0.5), percentile(rpo, 0.99)
    print(f"RPO under pgbench: p50 {p50:.2f} s, p99 {p99:.2f} s (target p99 <= 5 s)")
    return p99


def _until_lease_lapsed(seaweed: SeaweedFS, url: str) -> None:
    """Until the lost platform's lease on the prefix has run out: what a recovery waits for
    first (a platform that may still be alive is never recovered over), timed apart."""
    bucket, prefix = parse_url(url)
    client = seaweed.client(attempts=3)
    try:
        while True:
            body = client.get_object(Bucket=bucket, Key=f"{prefix}{claim.LEASE}")["Body"].read()
            if json.loads(body)["expires_at"] < time.time():
                return
            time.sleep(0.2)
    finally:
        client.close()


def _as_owner(argv: list[str], owner: os.stat_result, log: Path | None = None) -> None:
    """Run ``argv`` as the owner of the compute's data when root (its OS user: Postgres refuses
    root, and only that user and root enter its socket directory), else as ourselves."""
    switch = os.geteuid() == 0
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        cwd="/",
        env=postgres_env(),  # no PG* variable of ours steers the programs
        timeout=3600,
        user=owner.st_uid if switch else None,
        group=owner.st_gid if switch else None,
        extra_groups=[] if switch else None,
    )
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"{Path(argv[0]).name} failed:\n{done.stdout}{done.stderr}{tail}")


def _tree_bytes(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure_baseline(data_dir: Path, pgdata: Path) -> float:
    """``pg_basebackup -X stream`` of the running compute of ``pgdata``, then a postgres on the
    copy until it accepts connections; the seconds of both together (the copy removed after)."""
    layout = Layout(data_dir.resolve())
    running = Records(layout.postmaster_records).get(pgdata)
    assert running is not None and is_alive(running), f"no compute runs on {pgdata}"
    owner = pgdata.stat()
    scratch = Path(tempfile.mkdtemp(prefix="pgplane-bench-basebackup-"))
    os.chown(scratch, owner.st_uid, owner.st_gid)
    copy, log = scratch / "pgdata", scratch / "postgres.log"
    # The compute's own installation: run as its user, who may not enter the venv's (a clone
    # under /root), the platform runs a copy it can (compute/local/postgres/relocate.py).
    bin_dir = Path(running.argv[0]).parent
    pg_ctl = str(bin_dir / "pg_ctl")
    try:
        began = time.monotonic()
        _as_owner(
            [
                str(bin_dir / "pg_basebackup"),
                f"--dbname=host={running.socket_dir} port={running.port} user={ADMIN_USER}"
                " sslmode=disable",
                f"--pgdata={copy}",
                "--wal-method=stream",
                "--checkpoint=fast",  # not up to a checkpoint_timeout spent waiting for one
            ],
            owner,
        )
        backup = time.monotonic() - began
        size = _tree_bytes(copy)
        # Its own socket directory, no TCP, and nothing archived: the copy's postgresql.conf
        # is initdb's (the compute's settings are on its command line), this says so anyway.
        options = f"-c listen_addresses= -c unix_socket_directories={scratch} -c archive_mode=off"
        began = time.monotonic()
        _as_owner(
            [pg_ctl, "-D", str(copy), "-l", str(log), "-o", options, "-w", "-t", "3600", "start"],
            owner,
            log,
        )
        replay = time.monotonic() - began
    finally:
        if (copy / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                _as_owner([pg_ctl, "-D", str(copy), "-m", "fast", "-w", "stop"], owner)
        shutil.rmtree(scratch, ignore_errors=True)
    took = backup + replay
    print(
        f"baseline (pg_basebackup + replay): {took:.1f} s for {size / 1e6:.0f} MB"
        f" (backup {backup:.1f} s, replay until it accepts connections {replay:.1f} s)"
    )
    return took


def measure_recover(on: Server, uri: str, seaweed: SeaweedFS, url: str, pgdata: Path) -> float:
    """Seconds ``pgplane recover`` took, over the baseline's (run first, on the same compute)."""
    with psycopg.connect(plaintext(uri)) as conn:
        row = conn.execute("SELECT pg_database_size('neondb')").fetchone()
    size = int(row[0]) if row else 0
    baseline = measure_baseline(on.data_dir, pgdata)
    _lose(on)
    lost_at = time.monotonic()
    _until_lease_lapsed(seaweed, url)
    print(f"the lost platform's lease lapsed {time.monotonic() - lost_at:.1f} s after the loss")
    target = make_data_dir()
    try:
        began = time.monotonic()
        done = subprocess.run(
            [*PGPLANE, "recover", "--data-dir", str(target)],
            capture_output=True,
            text=True,
            env=on.env,
            check=False,
            timeout=3600,
        )
        took = time.monotonic() - began
        if done.returncode != 0:
            raise RuntimeError(f"recover failed:\n{done.stdout}\n{done.stderr}")
        branches = json.loads(done.stdout)["branches"]
        for line in done.stderr.splitlines():  # where its time went
            if any(
                what in line
                for what in ("rebuilt from base state", "history fetched", "base state ", "WAL of")
            ):
                print(f"  recover: {line.split(': ', 1)[-1]}")
        print(
            f"recover: {took:.1f} s for {len(branches)} branch(es), the database"
            f" {size / 1e6:.0f} MB ({size / 1e6 / took:.0f} MB/s)"
        )
    finally:
        stop_postmasters(target)
        remove_project_users(target)
        unmount_volumes(target)
        remove_in_background(target)
    ratio = took / baseline
    print(f"recover / baseline: {ratio:.2f}x (target <= 1.5x)")
    return ratio


def run(args: argparse.Namespace) -> int:
    seaweed = SeaweedFS(Path(tempfile.mkdtemp(prefix="pgplane-bench-s3-")))
    seaweed.start()
    key_file = seaweed.directory / "archive.key"
    key_file.write_bytes(os.urandom(32))
    key_file.chmod(0o600)
    url = seaweed.url("bench")
    env = {**seaweed.env(), "PGPLANE_OBJECT_STORE": url, "PGPLANE_ARCHIVE_KEY_FILE": str(key_file)}
    if args.smoke:  # the lost platform's lease lapses sooner (its wait is no figure)
        env |= {"PGPLANE_NODE_LEASE_SECONDS": "5", "PGPLANE_NODE_HEARTBEAT_SECONDS": "1"}
    try:
        sync_env = {**env, "PGPLANE_OBJECT_STORE": seaweed.url("bench-sync")}
        with (
            running_server(**env) as on,
            running_server() as off,
            running_server(**sync_env, PGPLANE_ARCHIVE_SYNC="on") as sync,
        ):
            api_on = Api(on, on.create_key("bench@example.com")[1])
            body = api_on.create_ready_project(name="object-store-on")
            uri = body["connection_uris"][0]["connection_uri"]
            uris = {"on": uri}
            servers = {"on": on, "off": off, "sync": sync}
            for side, server in (("off", off), ("sync", sync)):
                with Api(server, server.create_key("bench@example.com")[1]) as api:
                    other = api.create_ready_project(name=f"object-store-{side}")
                uris[side] = other["connection_uris"][0]["connection_uri"]
            ratio = measure_cost(uris, servers, args)
            prefix = shipping.prefix_of(body["project"]["id"], body["branch"]["id"])
            watch = StoreWatch(seaweed, url, key_file.read_bytes(), prefix)
            p99 = measure_rpo(uri, watch, args.samples)
            pgdata = Layout(on.data_dir.resolve()).pgdata(
                body["project"]["id"], body["branch"]["id"]
            )
            recover = measure_recover(on, uri, seaweed, url, pgdata)
            api_on.http.close()
    finally:
        seaweed.stop()
        shutil.rmtree(seaweed.directory, ignore_errors=True)
    if args.smoke:
        return 0
    return verdict(
        {
            "cost >= 0.9x": ratio >= 0.9,
            "RPO p99 <= 5 s": p99 <= 5.0,
            "recover within 1.5x of the baseline": recover <= 1.5,
        }
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=int, default=65, help="pgbench's: 65 is ~1 GB")
    parser.add_argument("--samples", type=int, default=40, help="RPO markers")
    parser.add_argument("--smoke", action="store_true", help="once, small, no target checked")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds, args.scale, args.samples = 3, 1, 1, 6
    raise SystemExit(run(args))


if __name__ == "__main__":
    main()
