"""Wake on connect, beside the bare cost of the same postmaster; and what an idle compute costs.

On a real ``pgplane serve``, rounds interleaved so both sides see the same machine:

- **wake**: the endpoint suspended (its postmaster stopped), a client connects through the proxy
  (plaintext, SCRAM) and runs ``select 1``: connect to first row;
- **bare**: the same postmaster command line (as the platform recorded it) spawned on the same
  data directory by hand, with no sandbox and no cgroup, a client polling its socket with real
  startups until it answers, the same query: spawn to first row. Then SIGINT and wait.

As root the wake's path holds the compute's sandbox (bubblewrap) and its cgroup: the bare side
holds neither. Targets: wake p50 within 1.5x the bare p50, p99 within 5x the bare p99.

Then **idle memory**: N more projects whose computes are suspended; the pgplane process's RSS
growth per idle endpoint, plus the postmasters left running for them (none). Target: < 10 MB.

    .venv/bin/python -m bench.wake [--wakes 60] [--idle 20] [--smoke]

``--smoke`` runs three of each and checks no target: CI runs it, so the bench cannot rot.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import time
from pathlib import Path

import psycopg

from bench.common import Api, Server, median, percentile, running_server, verdict
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records


def _suspend(api: Api, pid: str, eid: str) -> None:
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"], ops


def _first_row(conninfo: str, *, retry: bool) -> float:
    """Seconds from now until ``select 1`` returned a row (retrying refused startups)."""
    started = time.perf_counter()
    while True:
        try:
            with psycopg.connect(conninfo, connect_timeout=30) as conn:
                assert conn.execute("select 1").fetchone() == (1,)
                return time.perf_counter() - started
        except psycopg.OperationalError:
            if not retry or time.perf_counter() - started > 30:
                raise
            time.sleep(0.001)


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _bare(argv: list[str], pgdata: Path, conninfo: str) -> float:
    st = pgdata.stat()
    as_root = os.geteuid() == 0
    # pgplane removes a suspended compute's socket directories (its own, and its WAL stream's
    # when history goes to an object store: -k takes a list); Postgres needs them to exist.
    for socket_dir in (Path(d) for d in argv[argv.index("-k") + 1].split(",")):
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        os.chown(socket_dir, st.st_uid, st.st_gid)
    started = time.perf_counter()
    child = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        user=st.st_uid if as_root else None,
        group=st.st_gid if as_root else None,
        extra_groups=[] if as_root else None,
    )
    try:
        _first_row(conninfo, retry=True)
        return time.perf_counter() - started
    finally:
        child.send_signal(signal.SIGINT)
        child.wait(30)


def run(server: Server, api: Api, wakes: int, idle: int) -> dict[str, bool]:
    body = api.create_ready_project(name="wake")
    pid, eid, bid = body["project"]["id"], body["endpoints"][0]["id"], body["branch"]["id"]
    uri = body["connection_uris"][0]["connection_uri"].replace("sslmode=require", "sslmode=disable")
    params = body["connection_uris"][0]["connection_parameters"]
    pgdata = Layout(server.data_dir.resolve()).pgdata(pid, bid)
    running = Records(Layout(server.data_dir.resolve()).postmaster_records).get(pgdata)
    assert running is not None
    argv = list(running.argv)
    # Its socket: a sandboxed compute has no TCP port on the machine (its network is its own).
    direct = (
        f"host={running.socket_dir} port={running.port} user={params['role']}"
        f" dbname={params['database']} sslmode=disable"
    )
    wake_s, bare_s = [], []
    for _ in range(wakes):
        _suspend(api, pid, eid)
        wake_s.append(_first_row(uri, retry=False))
        _suspend(api, pid, eid)
        bare_s.append(_bare(argv, pgdata, direct))
    ms = 1000.0
    w50, w99 = median(wake_s) * ms, percentile(wake_s, 0.99) * ms
    b50, b99 = median(bare_s) * ms, percentile(bare_s, 0.99) * ms
    print(f"wake on connect, {wakes} wakes (connect to first row, plaintext, SCRAM)")
    print(f"  bare spawn + first row   p50 {b50:7.1f} ms   p99 {b99:7.1f} ms")
    print(f"  wake through the proxy   p50 {w50:7.1f} ms   p99 {w99:7.1f} ms")
    print(
        f"  ratio                    p50 {w50 / b50:7.2f}x (target <= 1.5x)"
        f"   p99 {w99 / b99:7.2f}x (target <= 5x)"
    )

    assert server.process is not None
    before = _rss_kb(server.process.pid)
    projects = []
    for i in range(idle):
        made = api.create_ready_project(name=f"idle-{i}")
        projects.append((made["project"]["id"], made["endpoints"][0]["id"]))
    for project_id, endpoint_id in projects:
        _suspend(api, project_id, endpoint_id)
    after = _rss_kb(server.process.pid)
    left = [
        p
        for p, _ in projects
        if list(server.data_dir.glob(f"projects/{p}/branches/*/pgdata/postmaster.pid"))
    ]
    per = max(0, after - before) / idle / 1024
    print(f"idle computes: {idle} suspended endpoints")
    print(f"  postmasters left running for them: {len(left)}")
    print(
        f"  pgplane RSS {before / 1024:.1f} MB -> {after / 1024:.1f} MB:"
        f" {per:.2f} MB per idle endpoint (target < 10 MB)"
    )
    return {
        "wake p50 <= 1.5x a bare start": w50 <= 1.5 * b50,
        "wake p99 <= 5x a bare start": w99 <= 5 * b99,
        "no postmaster left for a suspended endpoint": not left,
        "< 10 MB per idle endpoint": per < 10,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wakes", type=int, default=60)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="three of each, no target checked")
    args = parser.parse_args()
    if args.smoke:
        args.wakes, args.idle = 3, 3
    # The idle computes are one account's: its project quota raised to hold them.
    with running_server(PGPLANE_PROJECTS_PER_ACCOUNT=str(args.idle + 5)) as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            met = run(server, api, args.wakes, args.idle)
    return 0 if args.smoke else verdict(met)


if __name__ == "__main__":
    raise SystemExit(main())
