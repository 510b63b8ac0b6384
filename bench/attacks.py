"""Every way one account found to slow another (issue 33), each beside another account's load.

As root (computes sandboxed, in cgroups, one OS user per project). Account A is the attacker:
its owner role made superuser by hand (as a Postgres CVE would), its strangers dialling from
addresses of their own (127.0.0.2 to .9). Account B is the neighbour, running a steady load
from its own threads, each request timed, at a pace a busy application keeps (``--rate``
rounds of the first three a second, ``--wakes`` wakes a second; 0 runs them as fast as they
go, which leaves the 2-core machine nothing idle, so that anything A is allowed to use, its
compute's CPU quota say, shows in B's figures):

- ``api``: ``GET /projects/{id}`` with B's key;
- ``sql``: ``POST /sql`` ``SELECT 1`` on B's endpoint (the proxy's HTTP door, plain);
- ``login``: a new connection through the proxy's Postgres door, ``SELECT 1``, closed;
- ``wake``: B's second compute suspended through the API, then woken by a connection (the
  connection is what is timed).

Each attack runs for ``--seconds`` beside that load, and the same load runs alone before it
(rounds interleaved, so both see the same machine). Printed per attack and kind: p50 and p99
alone and beside, and their ratios. Target: within 1.2x for every attack.

- ``cpu``: four busy loops and a memory eater in A's compute, from its shell;
- ``machine`` (the control): the same outside the platform, in a cgroup of its own with the
  same limits: what any neighbour using a compute's share does to B on this machine;
- ``verifier``: wrong-password logins of an A role whose ``pg_authid`` row holds a 32 MB
  "verifier" (Postgres 15, whose catalog still takes one; item 1);
- ``body``: ``POST /sql`` of a 9.8 MB body with a wrong password, two at a time (item 2);
- ``strangers``: logins naming made-up roles on A's endpoint, and made-up endpoints, 8 at a
  time from 127.0.0.2-9 (items 5 and 8);
- ``stopped``: A's compute woken, its postmaster stopped with SIGSTOP (as its tenant may),
  then suspended, again and again (item 6);
- ``pool``: 64 of A's ``/sql`` ``pg_sleep(1)`` at once (item 7).

    sudo .venv/bin/python -m bench.attacks [--seconds 10] [--rounds 2] [--only body,pool]

``--smoke`` (CI) runs each attack once, briefly, and checks only that none of B's requests
failed beside it.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import random
import signal
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import psycopg
from psycopg.conninfo import make_conninfo
from tests import pgclient

from bench.common import Api, Server, median, percentile, running_server, verdict
from bench.neighbours import _make_superuser, _noise, _project, _uri, noise_script
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.postgres.sessions import admin_conninfo
from pgplane.compute.local.tenants.cgroups import Cgroups, Limits
from pgplane.config import Settings

KINDS = ("api", "sql", "login", "wake")
STRANGERS = [f"127.0.0.{n}" for n in range(2, 10)]


@dataclass
class Sides:
    """What the load and the attacks need of the platform and the two accounts."""

    server: Server
    key_a: str  # for the attacker's own clients, made in its process
    api_a: Api
    api_b: Api
    a: dict[str, Any]
    b: dict[str, Any]
    b_sleepy: dict[str, Any]
    a15: dict[str, Any] | None  # A's Postgres 15 project, for the verifier (None: no 15 here)
    cu: float = 0.5  # the size of every compute here
    rate: float = 0.0  # B's api/sql/login rounds a second (0: as fast as they go)
    wakes: float = 0.0  # B's wakes a second (0: as fast as they go)


@dataclass
class Timings:
    seconds: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    errors: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))


def _sql(http: httpx.Client, port: int, uri: str, query: str) -> httpx.Response:
    """A query over SQL over HTTP, on ``http``'s kept-alive connection (as the driver's)."""
    return http.post(
        f"http://127.0.0.1:{port}/sql",
        headers={"Neon-Connection-String": uri},
        json={"query": query, "params": []},
    )


def _timed(timings: Timings, kind: str, step: Callable[[], object]) -> None:
    started = time.perf_counter()
    try:
        step()
    except Exception:
        timings.errors[kind] += 1
        return
    timings.seconds[kind].append(time.perf_counter() - started)


def _paced(per_second: float, stop: threading.Event) -> Iterator[None]:
    """A tick ``per_second`` times a second (as often as the loop goes round at 0) until
    ``stop``; a late tick is not made up for (no burst after a slow request)."""
    interval = 1 / per_second if per_second else 0.0
    due = time.monotonic()
    while not stop.is_set():
        yield
        due += interval
        late = time.monotonic() - due
        if late < 0:
            stop.wait(-late)
        else:
            due = time.monotonic()


def _steady(sides: Sides, timings: Timings, stop: threading.Event) -> None:
    """B's API, /sql and login requests, one after another, ``sides.rate`` rounds a second."""
    pid = sides.b["project"]["id"]
    uri = _uri(sides.b)
    port = sides.server.proxy_port
    with (
        httpx.Client(
            base_url=sides.api_b.http.base_url, headers=sides.api_b.http.headers, timeout=30
        ) as http,
        httpx.Client(timeout=30) as proxy,
    ):
        for _ in _paced(sides.rate, stop):
            _timed(timings, "api", lambda: http.get(f"/projects/{pid}").raise_for_status())
            _timed(timings, "sql", lambda: _sql(proxy, port, uri, "SELECT 1").raise_for_status())
            _timed(timings, "login", lambda: _login(uri))


def _login(uri: str) -> None:
    with psycopg.connect(uri, connect_timeout=30) as conn:
        conn.execute("SELECT 1")


def _wakes(sides: Sides, timings: Timings, stop: threading.Event) -> None:
    """B's second compute suspended, then woken by a connection (timed), ``sides.wakes``
    times a second."""
    pid = sides.b_sleepy["project"]["id"]
    eid = sides.b_sleepy["endpoints"][0]["id"]
    uri = _uri(sides.b_sleepy)
    for _ in _paced(sides.wakes, stop):
        try:
            sides.api_b.suspend(pid, eid)
        except AssertionError:
            timings.errors["wake"] += 1
            continue
        _timed(timings, "wake", lambda: _login(uri))


def _attacking(attack: Callable[[threading.Event], None], stop: Any) -> None:
    """An attack's own process, run only when no other wants a core (``SCHED_IDLE``): the
    attacker's client would run on a machine of its own, so only what the platform does for
    it may take B's CPU here. Nice 19 was not enough: the kernel lets a running task finish
    its slice before a waking one runs, and each of B's requests wakes several tasks (its
    client, the proxy, its compute), so A's client alone, at nice 19, doubled B's p99."""
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    done = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), done.set()), daemon=True).start()
    attack(done)


def _load(
    sides: Sides, seconds: float, attack: Callable[[threading.Event], None] | None
) -> Timings:
    """B's load for ``seconds``, beside ``attack`` (started first, in a process of its own)
    when given."""
    timings, stop = Timings(), threading.Event()
    forked = multiprocessing.get_context("fork")
    stop_attack = forked.Event()
    attacker = forked.Process(target=_attacking, args=(attack, stop_attack)) if attack else None
    if attacker is not None:
        attacker.start()
        time.sleep(1.0)  # under way before the load is timed
    load = [
        threading.Thread(target=_steady, args=(sides, timings, stop)),
        threading.Thread(target=_wakes, args=(sides, timings, stop)),
    ]
    for t in load:
        t.start()
    time.sleep(seconds)
    stop.set()
    stop_attack.set()
    for t in load:
        t.join()
    if attacker is not None:
        attacker.join(60)
        if attacker.is_alive():
            attacker.kill()
    return timings


def _many(
    count: int, each: Callable[[int, threading.Event], None]
) -> Callable[[threading.Event], None]:
    """An attack of ``count`` threads, each running ``each(n, stop)`` in a loop until stopped."""

    def run(stop: threading.Event) -> None:
        tries = [0] * count
        started = time.monotonic()

        def loop(n: int) -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):  # the attacker shrugs and goes on
                    each(n, stop)
                tries[n] += 1

        threads = [threading.Thread(target=loop, args=(n,)) for n in range(count)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # That the attack ran at strength, its client run only on idle cores.
        print(f"  (A's client: {sum(tries) / (time.monotonic() - started):.0f} tries a second)")

    return run


def _noise_outside(cu: float, seconds: int) -> None:
    """:func:`_noise` outside the platform: the same shell, in a cgroup of its own with a
    ``cu`` compute's limits, at the priority a compute runs at. B's figures beside it are what
    the machine (2 cores, a hypervisor's) does to B when another uses what a compute may use;
    no platform can do better, so the ``cpu`` row is judged beside this one."""
    groups, why = Cgroups.find()
    if groups is None:
        raise SystemExit(f"the machine attack needs cgroups: {why}")
    name = "pgplane-bench-machine"
    groups.create(name, Limits.for_size(cu, 10))

    def join() -> None:
        # As a compute runs, not as the attacker's client (SCHED_IDLE).
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        for procs in groups.procs_files(name):
            procs.write_text(str(os.getpid()))

    try:
        subprocess.run(["sh", "-c", noise_script(seconds)], preexec_fn=join, check=False)
    finally:
        groups.kill(name)


def _admin(server: Server, body: dict[str, Any]) -> str:
    pgdata = Layout(server.data_dir.resolve()).pgdata(body["project"]["id"], body["branch"]["id"])
    running = Records(server.data_dir.resolve() / "postmasters").get(pgdata)
    assert running is not None
    return admin_conninfo(running.socket_dir, running.port)


def attacks(sides: Sides, seconds: float) -> dict[str, Callable[[threading.Event], None]]:
    port = sides.server.proxy_port
    a_uri, a_eid = _uri(sides.a), sides.a["endpoints"][0]["id"]
    a_password = sides.a["connection_uris"][0]["connection_parameters"]["password"]
    found: dict[str, Callable[[threading.Event], None]] = {}

    def cpu(stop: threading.Event) -> None:
        while not stop.is_set():
            _noise(a_uri, int(seconds) + 2)

    found["cpu"] = cpu

    def machine(stop: threading.Event) -> None:
        while not stop.is_set():
            _noise_outside(sides.cu, int(seconds) + 2)

    found["machine"] = machine  # the control: what the machine does to B beside the same noise

    if sides.a15 is not None:
        bloated = make_conninfo(_uri(sides.a15), user="bloated", password="wrong")  # noqa: S106

        def verifier(n: int, stop: threading.Event) -> None:
            with psycopg.connect(bloated, connect_timeout=30):
                pass

        found["verifier"] = _many(4, verifier)

    body = b'{"query": "SELECT 1", "params": [[' + b",".join([b"1"] * 4_900_000) + b"]]}"
    wrong = a_uri.replace(f":{a_password}@", ":wrong@")

    def big_body(n: int, stop: threading.Event) -> None:
        httpx.post(
            f"http://127.0.0.1:{port}/sql",
            headers={"Neon-Connection-String": wrong, "Content-Type": "application/json"},
            content=body,
            timeout=60,
        )

    found["body"] = _many(2, big_body)

    def strangers(n: int, stop: threading.Event) -> None:
        source = STRANGERS[n % len(STRANGERS)]
        made_up = f"ep-made-up-{random.randrange(10**8):08d}"
        endpoint = a_eid if n % 2 else made_up
        role = f"nobody_{random.randrange(10**8)}"
        pgclient.refusal(port, source=source, endpoint=endpoint, user=role, password="x")  # noqa: S106

    found["strangers"] = _many(8, strangers)

    a_pid = sides.a["project"]["id"]
    a_pgdata = Layout(sides.server.data_dir.resolve()).pgdata(a_pid, sides.a["branch"]["id"])

    def stopped(stop: threading.Event) -> None:
        with Api(sides.server, sides.key_a) as api:
            while not stop.is_set():
                _login(a_uri)  # woken
                running = Records(sides.server.data_dir.resolve() / "postmasters").get(a_pgdata)
                pid = None if running is None else running.postmaster()
                if pid is not None:
                    os.kill(pid, signal.SIGSTOP)
                api.suspend(a_pid, a_eid)

    found["stopped"] = stopped

    clients: dict[int, httpx.Client] = {}  # one a thread, kept alive (as the driver's)
    # One TLS context for them all (none is used: the requests are plain HTTP). Each client
    # made its own, loading the CA bundle: 64 of them took ~2.5 s of CPU at each round's
    # start, which slowed B's wakes in the round's first seconds (its p99 2-3x) although
    # the attacker runs only on idle cores. A client of the platform would pay it on a machine
    # of its own.
    tls = ssl.create_default_context()

    def pool(n: int, stop: threading.Event) -> None:
        if n not in clients:
            clients[n] = httpx.Client(timeout=60, verify=tls)
        _sql(clients[n], port, a_uri, "SELECT pg_sleep(1)")

    found["pool"] = _many(64, pool)
    return found


def _setup(server: Server, key_a: str, api_a: Api, api_b: Api, cu: float) -> Sides:
    a = _project(api_a, "attacker", cu)
    _make_superuser(server.data_dir, a)
    b = _project(api_b, "neighbour", cu)
    b_sleepy = _project(api_b, "sleepy", cu)
    a15 = None
    # Postgres 15 where this machine has it (its pg_authid still takes a verifier of any size).
    r = api_a.http.post("/projects", json={"project": {"name": "attacker-15", "pg_version": 15}})
    if r.status_code == 201:
        a15 = r.json()
        api_a.wait_operations(a15["project"]["id"], [o["id"] for o in a15["operations"]])
        with psycopg.connect(_uri(a15), autocommit=True) as conn:
            conn.execute("CREATE ROLE bloated LOGIN")
        with psycopg.connect(_admin(server, a15), autocommit=True) as conn:
            conn.execute(
                "UPDATE pg_catalog.pg_authid SET rolpassword = %s WHERE rolname = 'bloated'",
                ("SCRAM-SHA-256$4096:" + "A" * (32 << 20),),
            )
    return Sides(server, key_a, api_a, api_b, a, b, b_sleepy, a15)


def _row(name: str, kind: str, alone: list[Timings], beside: list[Timings]) -> tuple[str, float]:
    def figures(runs: list[Timings]) -> tuple[float, float, int, int]:
        p50 = median([percentile(r.seconds[kind], 0.5) for r in runs if r.seconds[kind]] or [0])
        p99 = median([percentile(r.seconds[kind], 0.99) for r in runs if r.seconds[kind]] or [0])
        return p50, p99, sum(len(r.seconds[kind]) for r in runs), sum(r.errors[kind] for r in runs)

    a50, a99, an, ae = figures(alone)
    b50, b99, bn, be = figures(beside)
    r50 = b50 / a50 if a50 else float("inf")
    r99 = b99 / a99 if a99 else float("inf")
    line = (
        f"  {name:10s} {kind:6s} alone p50 {a50 * 1e3:8.1f} p99 {a99 * 1e3:8.1f} ms ({an}, {ae} err)"
        f" | beside p50 {b50 * 1e3:8.1f} p99 {b99 * 1e3:8.1f} ms ({bn}, {be} err)"
        f" | {r50:5.2f}x {r99:5.2f}x"
    )
    return line, max(r50, r99) if not be else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cu", type=float, default=0.5)
    parser.add_argument("--rate", type=float, default=40, help="B's rounds a second (0: all)")
    # One a second: within the platform's default pace of an account's starts (60 a minute
    # past a burst of 20); at two, B's own wakes wait their turn after ten seconds.
    parser.add_argument("--wakes", type=float, default=1, help="B's wakes a second (0: all)")
    parser.add_argument("--only", default="", help="attacks to run, comma-separated")
    parser.add_argument(
        "--smoke", action="store_true", help="once, short: every attack runs and fails none of B's"
    )
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 1.0, 1
    if os.geteuid() != 0:
        print("computes are walled only as root: run this as root")
        return 2
    lines: list[str] = []
    checks: dict[str, bool] = {}
    # The platform's own pace of compute starts (the tests' servers run without one).
    pace = {
        name: os.environ.get(name, str(getattr(Settings(), name.removeprefix("PGPLANE_").lower())))
        for name in ("PGPLANE_COMPUTE_STARTS_PER_MINUTE", "PGPLANE_COMPUTE_STARTS_BURST")
    }
    with running_server(**pace) as server:
        _, key_a = server.create_key("attacker@example.com")
        _, key_b = server.create_key("neighbour@example.com")
        with Api(server, key_a) as api_a, Api(server, key_b) as api_b:
            sides = _setup(server, key_a, api_a, api_b, args.cu)
            sides.rate, sides.wakes, sides.cu = args.rate, args.wakes, args.cu
            chosen = attacks(sides, args.seconds)
            if args.only:
                chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
            for name, attack in chosen.items():
                alone: list[Timings] = []
                beside: list[Timings] = []
                for n in range(args.rounds):
                    print(f"{name}: round {n + 1}, alone", flush=True)
                    alone.append(_load(sides, args.seconds, None))
                    print(f"{name}: round {n + 1}, beside the attack", flush=True)
                    beside.append(_load(sides, args.seconds, attack))
                    print(f"{name}: round {n + 1} done", flush=True)
                for kind in KINDS:
                    line, worst = _row(name, kind, alone, beside)
                    lines.append(line)
                    if args.smoke:  # too short to time: what holds is that nothing failed
                        checks[f"{name} {kind}: none of B's failed"] = worst != float("inf")
                    else:
                        checks[f"{name} {kind} within 1.2x"] = worst <= 1.2
    print(f"B's load alone and beside each attack, {args.rounds} rounds of {args.seconds} s")
    print("  (medians of the rounds' p50 and p99; requests and errors summed; ratios p50 p99)")
    for line in lines:
        print(line)
    return verdict(checks)


if __name__ == "__main__":
    raise SystemExit(main())
