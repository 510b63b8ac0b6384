"""Replica lag under ``pgbench`` on the primary: how long a commit takes to be visible on a
read-only compute of the same branch.

On a real ``pgplane serve``: a project, ``pgbench -i`` on its primary, one read-only compute.
While ``pgbench`` (TPC-B-like, through the proxy) loads the primary, a probe commits a numbered
row on the primary every ``--every`` ms and polls the replica (one open connection, through the
proxy) until that row is there: commit to visible, per probe. Also printed beside it: the same
probe with no load. Target: p99 under 100 ms under load.

    .venv/bin/python -m bench.replica_lag [--seconds 20] [--clients 4] [--every 50] [--smoke]
"""

from __future__ import annotations

import argparse
import subprocess
import threading
import time

import psycopg

from bench.common import (
    Api,
    median,
    parse_with_smoke,
    percentile,
    pg_binary,
    plaintext,
    running_server,
    verdict,
)

_POLL_S = 0.0005
_GIVE_UP_S = 10.0


def _uri(api: Api, pid: str, eid: str) -> str:
    r = api.http.get(
        f"/projects/{pid}/connection_uri",
        params={"database_name": "neondb", "role_name": "neondb_owner", "endpoint_id": eid},
    )
    assert r.status_code == 200, r.text
    return plaintext(str(r.json()["uri"]))


def _probe(primary: str, replica: str, *, seconds: float, every: float, first: int) -> list[float]:
    """Commit-to-visible lags (seconds) of the probes committed within ``seconds``."""
    lags = []
    deadline = time.monotonic() + seconds
    n = first
    with (
        psycopg.connect(primary, autocommit=True) as writer,
        psycopg.connect(replica, autocommit=True) as reader,
    ):
        while time.monotonic() < deadline:
            n += 1
            writer.execute("INSERT INTO probe VALUES (%s)", (n,))
            committed = time.perf_counter()
            while True:
                row = reader.execute("SELECT max(n) FROM probe").fetchone()
                if row is not None and row[0] is not None and row[0] >= n:
                    lags.append(time.perf_counter() - committed)
                    break
                if time.perf_counter() - committed > _GIVE_UP_S:
                    raise SystemExit(f"probe {n} not on the replica after {_GIVE_UP_S}s")
                time.sleep(_POLL_S)
            time.sleep(max(0.0, every - (time.perf_counter() - committed)))
    return lags


def _report(name: str, lags: list[float]) -> tuple[float, float]:
    p50, p99 = median(lags) * 1000, percentile(lags, 0.99) * 1000
    print(
        f"  {name:<28} {len(lags):5d} probes   p50 {p50:7.2f} ms   p99 {p99:7.2f} ms"
        f"   max {max(lags) * 1000:7.2f} ms"
    )
    return p50, p99


def run(api: Api, *, seconds: int, clients: int, every_ms: int, scale: int = 10) -> dict[str, bool]:
    body = api.create_ready_project(name="replica-lag")
    pid, bid = body["project"]["id"], body["branch"]["id"]
    primary = plaintext(body["connection_uris"][0]["connection_uri"])
    pgbench = pg_binary("pgbench")
    subprocess.run(
        [pgbench, "-i", "-q", "-s", str(scale), primary], check=True, capture_output=True
    )
    with psycopg.connect(primary, autocommit=True) as conn:
        conn.execute("CREATE TABLE probe (n int)")
    r = api.http.post(
        f"/projects/{pid}/endpoints", json={"endpoint": {"branch_id": bid, "type": "read_only"}}
    )
    replica_id = api.settled(pid, r)["endpoint"]["id"]
    replica = _uri(api, pid, replica_id)
    every = every_ms / 1000

    print(
        f"replica lag: commit on the primary to visible on the replica (probe every {every_ms} ms)"
    )
    idle = _probe(primary, replica, seconds=min(seconds, 10), every=every, first=0)
    _report("no load", idle)

    load = subprocess.Popen(
        [pgbench, "-n", "-c", str(clients), "-j", str(clients), "-T", str(seconds + 2), primary],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(load.communicate()[0]), daemon=True)
    reader.start()
    time.sleep(1)  # pgbench connected and running
    loaded = _probe(primary, replica, seconds=seconds, every=every, first=len(idle) + 1)
    reader.join(seconds + 60)
    tps = next((line for line in "".join(out).splitlines() if line.startswith("tps")), "tps ?")
    _, p99 = _report(f"pgbench -c {clients}", loaded)
    print(f"  pgbench on the primary meanwhile: {tps.strip()}")
    print(f"  target: p99 under load < 100 ms: {p99:.2f} ms")

    # What a replica's wake costs: its copy of the branch is made as it starts (no target).
    wakes = []
    for _ in range(5):
        api.suspend(pid, replica_id)
        started = time.perf_counter()
        with psycopg.connect(replica, connect_timeout=60) as conn:
            conn.execute("SELECT 1").fetchone()
        wakes.append(time.perf_counter() - started)
    print(
        f"replica wake (suspended, primary running, pgbench -s 10 data): connect to first row"
        f" p50 {median(wakes) * 1000:.0f} ms, max {max(wakes) * 1000:.0f} ms"
    )
    return {
        "replica lag p99 under pgbench < 100 ms": p99 < 100,
        "pgbench ran": load.returncode == 0,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--every", type=int, default=50, help="ms between probes")
    parser.add_argument("--scale", type=int, default=10, help="pgbench's")
    args = parse_with_smoke(parser, seconds=2, clients=1, scale=1)
    with running_server() as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            checks = run(
                api,
                seconds=args.seconds,
                clients=args.clients,
                every_ms=args.every,
                scale=args.scale,
            )
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
