"""Wake on connect through another node's proxy, beside the same wake through the project's own.

Two real ``pgplane serve`` nodes on one PostgreSQL store (the test harness's, tests/nodes.py);
one project on node B. Rounds interleaved so both sides see the same machine:

- **local wake**: the endpoint suspended, a client connects through node B's proxy (plaintext,
  SCRAM) and runs ``select 1``: connect to first row;
- **remote wake**: the same through node A's proxy, which authenticates the client and reaches
  B's compute through B's node door (mutual TLS), B waking it;
- **connect** to the running compute, and a **query** round trip on an open connection, through
  each proxy: what the node channel costs when nothing wakes.

Target: the remote wake's p50 within 1.2x the local one's (the channel adds a TLS handshake and
a hop to a wake that starts a postmaster).

    .venv/bin/python -m bench.wake_remote [--wakes 20] [--connects 50] [--queries 2000] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import psycopg
from tests.nodes import cli, home, running_nodes
from tests.pgstore import stop_store_cluster

from bench.common import Api, median, parse_with_smoke, percentile, verdict


def _suspend(api: Api, pid: str, eid: str) -> None:
    r = api.http.post(f"/projects/{pid}/endpoints/{eid}/suspend")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"], ops


def _first_row(conninfo: str) -> float:
    started = time.perf_counter()
    with psycopg.connect(conninfo, connect_timeout=60) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
    return time.perf_counter() - started


def _round_trips(conninfo: str, count: int) -> list[float]:
    with psycopg.connect(conninfo, connect_timeout=60, autocommit=True) as conn:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            conn.execute("select 1").fetchone()
            times.append(time.perf_counter() - started)
    return times


def _line(name: str, values: list[float]) -> tuple[float, float]:
    p50, p99 = median(values) * 1000, percentile(values, 0.99) * 1000
    print(f"  {name:<28} p50 {p50:8.2f} ms   p99 {p99:8.2f} ms")
    return p50, p99


def run(wakes: int, connects: int, queries: int) -> dict[str, bool]:
    with running_nodes(2) as servers:
        a, b = servers
        _, key = a.create_key("bench-wake-remote@example.com")
        with Api(a, key) as api:
            cli(a, "nodes", "cordon", "node-a")
            try:
                body: dict[str, Any] = api.create_ready_project(name="wake-remote")
            finally:
                cli(a, "nodes", "uncordon", "node-a")
            pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
            assert home(servers, pid) is b
            uri = body["connection_uris"][0]["connection_uri"]
            uri = uri.replace("sslmode=require", "sslmode=disable")
            through = {
                "local": uri.replace(f":{a.proxy_port}/", f":{b.proxy_port}/"),
                "remote": uri,  # node A's API gave its own proxy's address
            }
            woke: dict[str, list[float]] = {"local": [], "remote": []}
            for _ in range(wakes):
                for side in ("local", "remote"):
                    _suspend(api, pid, eid)
                    woke[side].append(_first_row(through[side]))
            connected: dict[str, list[float]] = {"local": [], "remote": []}
            for _ in range(connects):
                for side in ("local", "remote"):
                    connected[side].append(_first_row(through[side]))
            trips = {side: _round_trips(through[side], queries) for side in ("local", "remote")}

    print(f"wake on connect, {wakes} wakes a side (connect to first row, plaintext, SCRAM)")
    local50, local99 = _line("through the project's node", woke["local"])
    remote50, remote99 = _line("through another node", woke["remote"])
    print(
        f"  ratio                        p50 {remote50 / local50:8.2f}x   p99 {remote99 / local99:8.2f}x"
    )
    print(f"connect to a running compute, {connects} a side")
    c50, _ = _line("through the project's node", connected["local"])
    r50, _ = _line("through another node", connected["remote"])
    print(f"  ratio                        p50 {r50 / c50:8.2f}x")
    print(f"select 1 on an open connection, {queries} a side")
    q50, _ = _line("through the project's node", trips["local"])
    s50, _ = _line("through another node", trips["remote"])
    print(f"  ratio                        p50 {s50 / q50:8.2f}x")
    return {"remote wake p50 <= 1.2x a local one": remote50 <= 1.2 * local50}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wakes", type=int, default=20)
    parser.add_argument("--connects", type=int, default=50)
    parser.add_argument("--queries", type=int, default=2000)
    args = parse_with_smoke(parser, wakes=2, connects=5, queries=50)
    try:
        return verdict(run(args.wakes, args.connects, args.queries), smoke=args.smoke)
    finally:
        stop_store_cluster()  # the store's PostgreSQL, started by the first node


if __name__ == "__main__":
    raise SystemExit(main())
