"""Scenario F5: a restart storm. One compute is stopped and started over and over through the API
while a client keeps inserting through the proxy, as Neon's ``test_compute_restart`` does.

What must hold: every operation finishes (the user's and the ones the proxy's wakes started), the
compute ends up running, the platform holds exactly the processes and listening sockets it held
with one compute before the storm (nothing orphaned, no port left bound), and every row whose
insert was acknowledged is there.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import assert_operations_settled
from tests.crash import assert_consistent
from tests.support import Api, Server, running_server, wait_for

ENV = {
    "PGPLANE_RETRY_BASE_SECONDS": "0.2",
    "PGPLANE_SCHEDULER_SECONDS": "0.2",
    # Every stop lasts 200 ms more once its postmaster was told to go: the clients, whose
    # sessions it cuts, connect again within it, so some arrive while the compute stops.
    "PGPLANE_FAILPOINTS": "stop_compute:signalled=sleep(200)",
}
# What the platform logs when a connection arrives while its compute stops (services/endpoints).
ARRIVED_DURING_A_STOP = "a connection arrived while its compute stops"
# The scenario's "another client", four times: more connections arriving at every moment of a
# stop and a start.
CLIENTS = 4


# -- what the platform holds, read from /proc -------------------------------------------------


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            # The command (field 2) may hold spaces and parentheses: the ppid follows its ")".
            stat = (proc / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            tree.setdefault(ppid, []).append(int(proc.name))
    return tree


def _in(data_dir: Path, pid: int) -> bool:
    """A process working in ``data_dir``: Postgres processes chdir to their data directory, so
    this finds a compute's postmaster and every backend of it, orphaned ones included."""
    try:
        return Path(f"/proc/{pid}/cwd").readlink().is_relative_to(data_dir)
    except OSError:
        return False


def platform_processes(server: Server) -> dict[int, str]:
    """The server, its descendants, and every process working in its data directory, with what
    each is (a Postgres process's title names its role: checkpointer, walwriter, a backend)."""
    assert server.process is not None
    tree = _children()
    roots = {server.process.pid} | {
        pid for pids in tree.values() for pid in pids if _in(server.data_dir, pid)
    }
    found: dict[int, str] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in found:
            continue
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # exited meanwhile
        found[pid] = argv[0].decode(errors="replace")
        todo += tree.get(pid, [])
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = str(fd.readlink())
                    if target.startswith("socket:["):
                        inodes.add(target[8:-1])
    return inodes


def listening_sockets(pids: set[int]) -> list[str]:
    """The listening TCP and unix sockets the processes ``pids`` hold: kind and local address.

    Read in each process's own network namespace (a sandboxed compute has one of its own)."""
    inodes = _socket_inodes(pids)
    found: set[str] = set()
    for net in {_net(pid) for pid in pids} - {None}:
        try:  # a process gone since it was listed took its sockets with it
            tables = {t: (net / t).read_text() for t in ("tcp", "tcp6", "unix")}
        except (FileNotFoundError, ProcessLookupError):
            continue
        for table in ("tcp", "tcp6"):
            for line in tables[table].splitlines()[1:]:
                cols = line.split()
                if cols[3] == "0A" and cols[9] in inodes:  # 0A: LISTEN
                    found.add(f"tcp {cols[1]} {cols[9]}")
        for line in tables["unix"].splitlines()[1:]:
            cols = line.split()
            # Flags 00010000 (__SO_ACCEPTCON): a listening socket.
            if len(cols) >= 8 and int(cols[3], 16) & 0x10000 and cols[6] in inodes:
                found.add(f"unix {cols[7]} {cols[6]}")
    return sorted(found)


def _net(pid: int) -> Path | None:
    """/proc/<pid>/net, once per network namespace (the first process seen in it)."""
    try:
        namespace = os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None
    cached = _first_in_namespace.get(namespace)
    if cached is None or not cached.exists():  # the first one seen may have exited since
        cached = _first_in_namespace[namespace] = Path(f"/proc/{pid}/net")
    return cached


_first_in_namespace: dict[str, Path] = {}


@dataclass(frozen=True)
class Holdings:
    processes: Counter[str]  # by command title
    sockets: Counter[str]  # by kind: a compute may move to another port, never hold two
    addresses: list[str] = field(compare=False)

    @classmethod
    def of(cls, server: Server) -> Holdings:
        processes = platform_processes(server)
        addresses = listening_sockets(set(processes))
        kinds = Counter(address.split()[0] for address in addresses)
        # A process exiting has no command line (a zombie): held by nothing any more.
        return cls(Counter(t for t in processes.values() if t), kinds, addresses)


# A client backend's title: "postgres: <role> <database> <[local] or host(port)> <activity>".
_CLIENT_BACKEND = re.compile(r"postgres: \S+ \S+ (\[local\]|\S+\(\d+\)) ")


def wait_for_holdings(
    server: Server, until: Callable[[Holdings], bool], timeout: float = 60
) -> Holdings:
    """What the platform holds once ``until`` says so or ``timeout`` passed (backends of closed
    connections exit in their own time)."""
    deadline = time.monotonic() + timeout
    while not until(held := Holdings.of(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return held


def no_clients(held: Holdings) -> bool:
    return not any(_CLIENT_BACKEND.match(title) for title in held.processes)


# -- the inserting clients --------------------------------------------------------------------


@dataclass
class Inserter:
    """Inserts ids one by one through the proxy (from ``first``), connecting again whenever the
    compute stopped under its session; an id is acknowledged when its autocommit INSERT returned.

    A session may be cut by a stop; a connection may not be refused: the proxy makes a client
    that arrives while its compute stops wait for the start that follows.
    """

    uri: str
    first: int = 0
    acknowledged: list[int] = field(default_factory=list)
    attempted: int = 0
    sessions_cut: int = 0
    refused: list[str] = field(default_factory=list)
    unexpected: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        ids = itertools.count(self.first)
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self.stop.is_set():
                if conn is None:
                    try:
                        conn = psycopg.connect(self.uri, autocommit=True, connect_timeout=60)
                    except psycopg.OperationalError as exc:
                        self.refused.append(str(exc))
                        continue
                n = next(ids)
                self.attempted = n + 1 - self.first
                try:
                    conn.execute("INSERT INTO acks VALUES (%s)", [n])
                except psycopg.OperationalError:
                    # The compute stopped under the session: the id in flight may or may not be
                    # in. As a client does, connect again.
                    conn.close()
                    conn, self.sessions_cut = None, self.sessions_cut + 1
                    continue
                self.acknowledged.append(n)
        except BaseException as exc:
            self.unexpected.append(exc)
        finally:
            if conn is not None:
                conn.close()


@contextlib.contextmanager
def inserting(uri: str, clients: int) -> Iterator[list[Inserter]]:
    """``clients`` inserters, each on a thread of its own, with ids of its own."""
    inserters = [Inserter(uri, first=n * 1_000_000) for n in range(clients)]
    threads = [threading.Thread(target=i.run, name=f"inserter {i.first}") for i in inserters]
    for thread in threads:
        thread.start()
    try:
        yield inserters
    finally:
        for inserter in inserters:
            inserter.stop.set()
        for thread in threads:
            thread.join(120)
    assert not any(thread.is_alive() for thread in threads)


# -- the storm ----------------------------------------------------------------------------------


def _cycle(api: Api, pid: str, eid: str, n: int) -> list[str]:
    """One stop and start, in turn: a suspend and a start sent back to back (the start queued
    behind the stop); a restart (the same pair in one request); a suspend alone, the inserting
    client's next connection starting the compute again through the proxy."""
    base = f"/projects/{pid}/endpoints/{eid}"
    actions = [["suspend", "start"], ["restart"], ["suspend"]][n % 3]
    op_ids = []
    for action in actions:
        r = api.http.post(f"{base}/{action}")
        assert r.status_code == 200, r.text
        op_ids += [o["id"] for o in r.json()["operations"]]
    return op_ids


@pytest.mark.parametrize(
    "cycles",
    [20, pytest.param(200, marks=[pytest.mark.slow, pytest.mark.timeout(3600)])],
    ids=lambda n: f"{n}-cycles",
)
def test_restart_storm_under_inserts(cycles: int) -> None:
    with running_server(**ENV) as server:
        before_any_compute = Holdings.of(server)
        _, key = server.create_key("storm@example.com")
        with Api(server, key) as api:
            body = api.create_ready_project(name="storm")
            pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
            uri = body["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, autocommit=True, connect_timeout=30) as conn:
                conn.execute("CREATE TABLE acks (id int PRIMARY KEY)")
            one_compute = wait_for_holdings(server, no_clients)
            assert no_clients(one_compute), one_compute
            compute = one_compute.processes - before_any_compute.processes
            # One postmaster (its title is its command) and its helpers (titled "postgres: …"),
            # as root inside a sandbox: bwrap, and bwrap as the sandbox's pid 1.
            sandbox = [(p, n) for p, n in compute.items() if Path(p).name == "bwrap"]
            assert [n for _, n in sandbox] == ([2] if os.geteuid() == 0 else []), compute
            postmaster = [
                (p, n)
                for p, n in compute.items()
                if not p.startswith("postgres: ") and Path(p).name != "bwrap"
            ]
            assert len(postmaster) == 1 and postmaster[0][1] == 1, compute
            added = one_compute.sockets - before_any_compute.sockets
            # Its socket and its branch's replication socket (read replicas stream from it), and
            # its port unless its network is its own (then it listens on none).
            expected = {"unix": 2} if sandbox else {"tcp": 1, "unix": 2}
            assert added == expected, one_compute

            started = time.monotonic()
            with inserting(uri, CLIENTS) as inserters:
                ops: list[dict[str, Any]] = []
                pending: list[str] = []
                for n in range(cycles):
                    pending += _cycle(api, pid, eid, n)
                    if n % 2 == 0 and n < cycles - 1:
                        continue  # the next cycle's requests follow at once, queued behind these
                    ops += api.wait_operations(pid, pending, timeout=120)
                    pending = []
                    # A few rows from each client before the next cycles, so that each stop meets
                    # working clients (and a compute left suspended is woken by them).
                    wanted = [len(i.acknowledged) + 3 for i in inserters]
                    wait_for(
                        "rows from every client",
                        lambda wanted=wanted: all(
                            len(i.acknowledged) >= want or i.unexpected
                            for i, want in zip(inserters, wanted, strict=True)
                        ),
                        server=server,
                    )
            elapsed = time.monotonic() - started
            print(
                f"{cycles} cycles in {elapsed:.1f} s ({elapsed / cycles * 1000:.0f} ms each);"
                f" {sum(len(i.acknowledged) for i in inserters)} inserts acknowledged of"
                f" {sum(i.attempted for i in inserters)}, {sum(i.sessions_cut for i in inserters)}"
                f" sessions cut, {server.log().count(ARRIVED_DURING_A_STOP)} connections arrived"
                " during a stop"
            )
            assert [i.unexpected for i in inserters] == [[]] * CLIENTS
            assert [i.refused for i in inserters] == [[]] * CLIENTS
            # Clients did arrive during stops (and none was refused: they waited for the start).
            assert server.log().count(ARRIVED_DURING_A_STOP) >= 1, server.log()[-3000:]
            assert [o for o in ops if o["status"] != "finished"] == []
            # The proxy's own wakes (start_compute) settled too, and nothing failed.
            assert_operations_settled(server)

            r = api.http.get(f"/projects/{pid}/endpoints/{eid}")
            endpoint = r.json()["endpoint"]
            assert endpoint["current_state"] == "active", r.text
            assert "pending_state" not in endpoint, r.text  # nothing more on its way

            with psycopg.connect(uri, autocommit=True, connect_timeout=30) as conn:
                present = {row[0] for row in conn.execute("SELECT id FROM acks")}
            for inserter in inserters:
                assert set(inserter.acknowledged) <= present
            tried = {n for i in inserters for n in range(i.first, i.first + i.attempted)}
            assert present <= tried

            held = wait_for_holdings(server, lambda held: held == one_compute)
            assert held == one_compute
            assert_consistent(server, api, pid)
