"""Several nodes on one PostgreSQL store, measured in one run, each figure beside its baseline.

1. Authenticated ``GET /projects/{id}/operations?limit=10`` (an account's page of ten, rate
   limits checked on every request): one node on SQLite, one node on PostgreSQL, and two nodes
   on PostgreSQL behind a simple round-robin (wrk's two threads, each thread's connections to
   one node, as a layer-4 balancer spreads them), in interleaved rounds, medians reported.
   Target: two nodes at least 1.7x one. Beside it, the CPU each request cost every process
   involved (the nodes, the store's server, wrk), and what that allows on this machine: N cores
   serve at most N / (CPU per request) requests a second, whatever the nodes; a node, one event
   loop, at most one core. Measured twice: with every process sharing the machine's cores, and
   with each node held to ``--node-cpus`` of CPU (0.5 by default: a cgroup per node, v1 cpu
   controller's CFS quota), as nodes on machines of their own would be, beside one store and one
   client that are not what the nodes share. On a machine of two cores the first is bound by the
   machine (printed); the second is how the nodes scale, and the target is checked on it.
2. Operations claimed per second on each store, as the engine claims them
   (bench/store_backends.py's dispatchers: one on each store; four on PostgreSQL).
3. A node's lost-lease recovery after SIGKILL: an operation of node B's is held at a failpoint
   and B is killed. How long until node A sees B down (B's lease lapses:
   ``PGPLANE_NODE_LEASE_SECONDS``, 20 by default), and, once B is started again on the same data
   directory, how long until the interrupted operation has finished, beside B's own start (to
   its API answering) and the same operation on a node never killed.

The store's PostgreSQL is the tests' (tests/pgstore.py: the platform's binaries, fsync off), on
this machine: its CPU is counted with the rest.

    .venv/bin/python -m bench.nodes [--seconds 10] [--rounds 3] [--connections 64] [--node-cpus 0.5]
        [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.nodes import home, running_nodes
from tests.pgstore import stop_store_cluster, store_cluster
from tests.stores import store_sql
from tests.support import Api

from bench.api_throughput import LIMITS_ON, operations_page
from bench.common import ROOT, Server, median, parse_with_smoke, running_server, verdict
from bench.store_backends import claims
from pgplane.core import clock
from pgplane.store import Store
from pgplane.store.postgresql import PostgresStore
from pgplane.store.sqlite import SqliteStore

_LUA = Path(ROOT) / "bench" / "round_robin.lua"
_CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Run:
    rps: float
    p99_ms: float
    non_2xx: int
    cpu_ms: dict[str, float]  # CPU per request, by process group


def _cpu_seconds(pid: int) -> float:
    """The process' CPU so far, its threads' and its reaped children's included."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime + cutime + cstime) / _TICKS


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                if int(stat[1]) == pid:
                    found.append(int(proc.name))
    return found


def _store_cpu() -> float:
    """The store cluster's CPU so far: its postmaster's, and its backends' (live or reaped)."""
    postmaster = store_cluster().postmaster_pid
    assert postmaster is not None
    total = _cpu_seconds(postmaster)
    for child in _children(postmaster):
        with contextlib.suppress(OSError):
            total += _cpu_seconds(child)
    return total


def _wrk(url: str, key: str, ports: list[int], args: argparse.Namespace) -> tuple[str, float]:
    """wrk's output, and the CPU it used."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    cmd = ["wrk", "-t2", f"-c{args.connections}", f"-d{args.seconds}s", "--latency",
           "-H", f"Authorization: Bearer {key}", "-s", str(_LUA), url]  # fmt: skip
    env = {**os.environ, "PGPLANE_BENCH_PORTS": " ".join(map(str, ports))}
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, stdout=out, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if proc.returncode != 0 or "Requests/sec" not in text:
        raise RuntimeError(f"wrk failed:\n{text}")
    return text, usage.ru_utime + usage.ru_stime


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def load(servers: list[Server], url: str, key: str, args: argparse.Namespace) -> Run:
    """wrk against ``servers`` (its two threads spread over them), with the CPU per request of
    the nodes, the store (if PostgreSQL) and wrk."""
    pids = [s.process.pid for s in servers if s.process is not None]
    on_pg = "PGPLANE_STORE" in servers[0].env
    nodes_before = sum(_cpu_seconds(p) for p in pids)
    store_before = _store_cpu() if on_pg else 0.0
    text, wrk_cpu = _wrk(url, key, [s.port for s in servers], args)
    nodes_cpu = sum(_cpu_seconds(p) for p in pids) - nodes_before
    store_cpu = (_store_cpu() - store_before) if on_pg else 0.0
    requests = int(re.search(r"(\d+) requests in", text).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    per = {"nodes": nodes_cpu, "store": store_cpu, "wrk": wrk_cpu}
    return Run(
        rps=float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1)),  # type: ignore[union-attr]
        p99_ms=_ms(re.search(r"^\s+99%\s+(\S+)", text, re.M).group(1)),  # type: ignore[union-attr]
        non_2xx=int(bad.group(1)) if bad else 0,
        cpu_ms={k: v * 1000 / max(requests, 1) for k, v in per.items()},
    )


@contextlib.contextmanager
def _setups() -> Iterator[dict[str, tuple[list[Server], str, str]]]:
    """The three sides, each with its page's URL and key: SQLite, PostgreSQL, two nodes."""
    with (
        running_server(**LIMITS_ON) as on_sqlite,
        running_server(store=store_cluster().database(), **LIMITS_ON) as on_pg,
        running_nodes(2, **LIMITS_ON) as two,
    ):
        sides = {}
        for name, servers in (
            ("one node, SQLite", [on_sqlite]),
            ("one node, PostgreSQL", [on_pg]),
            ("two nodes, PostgreSQL", list(two)),
        ):
            url, headers = operations_page(servers[0])
            sides[name] = (servers, url, headers["Authorization"].removeprefix("Bearer "))
        time.sleep(2)  # the pages' operations settle: the engines idle
        yield sides


@contextlib.contextmanager
def cpu_budget(pids: list[int], cpus: float) -> Iterator[None]:
    """Each process held to ``cpus`` of CPU, as on a machine of its own that size: a cgroup of
    its own (v1 cpu controller) with that CFS quota, for as long as the block runs."""
    if os.geteuid() != 0 or not (_CPU_CGROUPS / "cgroup.procs").exists():
        raise SystemExit("--node-cpus needs root and the cgroup v1 cpu controller")
    made = []
    try:
        for pid in pids:
            group = _CPU_CGROUPS / f"pgplane-bench-node-{pid}"
            group.mkdir(exist_ok=True)
            made.append(group)
            (group / "cpu.cfs_period_us").write_text("100000")
            (group / "cpu.cfs_quota_us").write_text(str(int(cpus * 100000)))
            (group / "cgroup.procs").write_text(str(pid))  # the process and all its threads
        yield
    finally:
        for group in made:
            for pid_text in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):  # gone meanwhile
                    (_CPU_CGROUPS / "cgroup.procs").write_text(pid_text)
            group.rmdir()


def _rounds(
    sides: dict[str, tuple[list[Server], str, str]], args: argparse.Namespace
) -> dict[str, list[Run]]:
    runs: dict[str, list[Run]] = {name: [] for name in sides}
    for _ in range(args.rounds):  # interleaved: the machine's neighbours come and go
        for name, (servers, url, key) in sides.items():
            runs[name].append(load(servers, url, key, args))
    return runs


def _report(title: str, runs: dict[str, list[Run]]) -> float:
    """The runs printed; two nodes over one, on PostgreSQL."""
    print(title)
    for name, each in runs.items():
        rounds = ", ".join(f"{r.rps:.0f}/s" for r in each)
        cpu = {k: median([r.cpu_ms[k] for r in each]) for k in ("nodes", "store", "wrk")}
        print(
            f"  {name + ':':24} {median([r.rps for r in each]):7.0f} req/s"
            f"  p99 {median([r.p99_ms for r in each]):6.1f} ms  ({rounds})"
            f"  CPU per request: nodes {cpu['nodes']:.3f} ms, store {cpu['store']:.3f} ms,"
            f" wrk {cpu['wrk']:.3f} ms"
        )
    sqlite, pg, two = (median([r.rps for r in runs[n]]) for n in runs)
    print(f"  PostgreSQL / SQLite, one node:          {pg / sqlite:6.2f}x")
    print(f"  two nodes / one node, PostgreSQL:       {two / pg:6.2f}x  (target >= 1.7x)")
    return two / pg


def throughput(args: argparse.Namespace) -> dict[str, bool]:
    with _setups() as sides:
        shared = _rounds(sides, args)
        nodes = sorted({s.process.pid for each, _, _ in sides.values() for s in each if s.process})
        with cpu_budget(nodes, args.node_cpus):
            budget = _rounds(sides, args)
    print("GET …/operations?limit=10, authenticated, rate limits checked")
    _report("every process on the machine's cores", shared)
    cores = os.cpu_count() or 1
    per_request = median([sum(r.cpu_ms.values()) for r in shared["two nodes, PostgreSQL"]])
    node_cpu = median([r.cpu_ms["nodes"] for r in shared["one node, PostgreSQL"]])
    pg = median([r.rps for r in shared["one node, PostgreSQL"]])
    machine = cores * 1000 / per_request
    print(
        f"  this machine's bound: {cores} cores / {per_request:.3f} ms of CPU per request"
        f" (nodes, store and wrk together) = {machine:.0f} req/s, {machine / pg:.2f}x one node;"
        f" one node's loop, one core / {node_cpu:.3f} ms = {1000 / node_cpu:.0f} req/s"
    )
    ratio = _report(f"each node held to {args.node_cpus:g} CPU (a machine of its own)", budget)
    non_2xx = sum(r.non_2xx for runs in (shared, budget) for each in runs.values() for r in each)
    return {
        f"two nodes >= 1.7x one node, each node its own {args.node_cpus:g} CPU ({ratio:.2f}x)": (
            ratio >= 1.7
        ),
        f"every answer 2xx ({non_2xx} not)": non_2xx == 0,
    }


async def _claims(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pgplane-bench-claims-") as tmp:
        await _claims_in(Path(tmp), args)


async def _claims_in(work: Path, args: argparse.Namespace) -> None:
    names = iter(range(1000))

    def sqlite() -> Callable[[], object]:
        path = work / f"claims{next(names)}.db"

        async def opener() -> Store:
            return SqliteStore(path)

        return opener

    def postgresql() -> Callable[[], object]:
        url = store_cluster().database()

        async def opener() -> Store:
            return await PostgresStore.open(url)

        return opener

    s = await claims(sqlite(), args.operations, 1)
    p = await claims(postgresql(), args.operations, 1)
    p4 = await claims(postgresql(), args.operations, 4)
    print("operations claimed (and finished) per second, as the engine does it")
    print(f"  SQLite, 1 dispatcher:      {s:8.0f}/s")
    print(f"  PostgreSQL, 1 dispatcher:  {p:8.0f}/s   ({p / s:.2f}x SQLite)")
    print(f"  PostgreSQL, 4 dispatchers: {p4:8.0f}/s   ({p4 / p:.2f}x one; several nodes' engines)")


def _role(api: Api, body: dict[str, Any], name: str) -> tuple[str, list[str]]:
    pid, branch = body["project"]["id"], body["branch"]["id"]
    r = api.http.post(f"/projects/{pid}/branches/{branch}/roles", json={"role": {"name": name}})
    assert r.status_code == 201, r.text
    return pid, [o["id"] for o in r.json()["operations"]]


def recovery(args: argparse.Namespace) -> None:
    lease = args.lease
    # The defaults' proportion: a heartbeat every quarter of the lease.
    env = {
        "PGPLANE_NODE_LEASE_SECONDS": str(lease),
        "PGPLANE_NODE_HEARTBEAT_SECONDS": str(lease / 4),
    }
    seen_down, restarts, recovered, undisturbed = [], [], [], []
    with running_nodes(2, **env) as (a, b):
        _, key = a.create_key("recovery@example.com")
        with Api(a, key) as api:
            first, second = api.create_ready_project(), api.create_ready_project()
            on_b = next(p for p in (first, second) if home((a, b), p["project"]["id"]) is b)
            on_a = first if on_b is second else second
            for i in range(args.recoveries):
                # Undisturbed: the same operation on node A.
                t0 = time.monotonic()
                pid, ops = _role(api, on_a, f"calm{i}")
                api.wait_operations(pid, ops, timeout=120, every=0.01)
                undisturbed.append(time.monotonic() - t0)
                # Node B held inside it, then killed.
                b.stop()
                b.env["PGPLANE_FAILPOINTS"] = "before:apply_config"
                b.start()
                pid, ops = _role(api, on_b, f"held{i}")
                b.wait_for_log("failpoint before:apply_config reached", times=i + 1)
                b.stop(signal.SIGKILL)
                killed = clock.now_us()
                # Down for every other node once its last lease ends: read from the store.
                row = store_sql(a).one("SELECT expires_at FROM nodes WHERE name = ?", ["node-b"])
                assert row is not None
                seen_down.append((int(row[0]) - killed) / 1e6)
                time.sleep(max(0.0, (int(row[0]) - clock.now_us()) / 1e6))  # as an operator would
                b.env.pop("PGPLANE_FAILPOINTS")
                t0 = time.monotonic()
                b.start()  # returns once its API answers
                restarts.append(time.monotonic() - t0)
                api.wait_operations(pid, ops, timeout=120, every=0.01)
                recovered.append(time.monotonic() - t0)
    print("a node's recovery after SIGKILL (an apply_config held inside its handler)")
    print(
        f"  down for the other nodes after:    {median(seen_down):6.1f} s"
        f"  (its last lease's end; lease {lease:g} s, a heartbeat every {lease / 4:g} s)"
    )
    print(f"  restarted, its API answering:      {median(restarts):6.2f} s")
    print(
        f"  restarted, the operation finished: {median(recovered):6.2f} s"
        f"  ({median(recovered) - median(restarts):.2f} s after its API answered; the same"
        f" operation undisturbed on another node: {median(undisturbed):.2f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--operations", type=int, default=400)
    parser.add_argument("--recoveries", type=int, default=2)
    parser.add_argument("--node-cpus", type=float, default=0.5)
    lease = float(os.environ.get("PGPLANE_NODE_LEASE_SECONDS", "20"))
    parser.add_argument("--lease", type=float, default=lease, help="s, for the recovery")
    args = parse_with_smoke(
        parser, seconds=1, rounds=1, connections=8, operations=20, recoveries=1, lease=4.0
    )
    try:
        checks = throughput(args)
        asyncio.run(_claims(args))
        recovery(args)
    finally:
        stop_store_cluster()
    print(f"(load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
