"""Proxy throughput: ``pgbench -S`` through the proxy beside the same compute reached directly.

One compute (as many compute units as the machine has CPUs: pgbench -i, scale 1), then rounds interleaved so both sides see the same machine:
``pgbench -S`` straight to the compute's own port, and through the proxy (plaintext, as direct is;
and, for information, with TLS, as clients with ``sslmode=require`` use it, when the platform's own
pgbench has TLS: the bundled wheel's is built without it). Medians of the rounds.

Target: through the proxy, at least 40% of direct.

    .venv/bin/python -m bench.proxy_throughput [--seconds 10] [--rounds 3] [--clients 8]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess

from bench.common import Api, client_has_tls, median, pg_binary, running_server, verdict
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records


def pgbench(conninfo: str, password: str, *args: str) -> str:
    done = subprocess.run(
        [pg_binary("pgbench"), *args, conninfo],
        capture_output=True,
        text=True,
        env={**os.environ, "PGPASSWORD": password},
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return done.stdout


def tps(output: str) -> float:
    found = re.search(r"tps = ([\d.]+) \(without initial connection time\)", output)
    assert found is not None, output
    return float(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    with running_server() as server:
        _, key = server.create_key("bench@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="pgbench")
            pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
            # As big as the machine: the proxy is measured, not the compute's CPU quota (as
            # root a compute's cgroup holds it to its compute units; 0.25 CU by default).
            size = float(min(16, os.cpu_count() or 1))
            change = {"autoscaling_limit_min_cu": size, "autoscaling_limit_max_cu": size}
            r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": change})
            assert r.status_code == 200, r.text
            api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
        bid = body["branch"]["id"]
        params = body["connection_uris"][0]["connection_parameters"]
        layout = Layout(server.data_dir.resolve())
        running = Records(layout.postmaster_records).get(layout.pgdata(pid, bid))
        assert running is not None
        who = f"user={params['role']} dbname={params['database']}"
        sides = {
            # Its own socket: a sandboxed compute has no TCP port on the machine.
            "direct": f"host={running.socket_dir} port={running.port} {who} sslmode=disable",
            "proxy": f"host=127.0.0.1 port={server.proxy_port} {who} sslmode=disable"
            f" options=endpoint={eid}",
        }
        if client_has_tls():
            sides["proxy, TLS"] = (
                f"host=127.0.0.1 port={server.proxy_port} {who} sslmode=require"
                f" options=endpoint={eid}"
            )
        else:
            print("pgbench here has no TLS (the bundled wheel is built without it): no TLS side")
        password = params["password"]
        pgbench(sides["direct"], password, "-i", "-q", "-s", "1")
        jobs = str(min(args.clients, 2))
        results: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, conninfo in sides.items():
                out = pgbench(
                    conninfo, password, "-S", "-n", "-c", str(args.clients), "-j", jobs,
                    "-T", str(args.seconds),
                )  # fmt: skip
                results[side].append(tps(out))
        direct = median(results["direct"])
        print(
            f"pgbench -S, {args.clients} clients, {args.rounds} x {args.seconds} s rounds"
            " (median tps)"
        )
        for side, values in results.items():
            runs = " / ".join(f"{v:,.0f}" for v in values)
            print(
                f"  {side:<12} {median(values):>10,.0f} tps  {median(values) / direct:6.0%}"
                f" of direct   ({runs})"
            )
        return verdict(
            {"through the proxy >= 40% of direct": median(results["proxy"]) >= 0.4 * direct}
        )


if __name__ == "__main__":
    raise SystemExit(main())
