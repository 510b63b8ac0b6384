"""Which postmaster serves a data directory, as the platform itself recorded when it started it.

``postmaster.pid`` is the tenant's file: a tenant holding its compute's OS user can write any
pid, port and socket directory there (another account's, seen in ``ps``), and root acting on
those would run its superuser work on that account's compute, or remove its socket directory.
So the platform never asks the pid file where a compute is. At each spawn it writes a record of
its own, in a directory only root can read (``<data_dir>/postmasters/``): the pid of the
process whose end ends the compute (bwrap's pid 1 of the sandbox, or the postmaster when there
is no sandbox), that process's start time (a pid the kernel gives to another process later has
another), the port, socket directory and command line it was given, the endpoint and cgroup.
A record whose process is gone, or is another process now, means "not running", never
"running elsewhere".

Records are written without fsync: they describe processes, which a reboot ends anyway; what
they must survive is a ``serve`` killed at any moment, and the page cache does.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

_HAS_PROC = Path("/proc/self").is_dir()


@dataclass(frozen=True, slots=True)
class Running:
    """A postmaster the platform started and that still runs."""

    leader: int  # its end ends the compute: the sandbox's pid 1, or the postmaster itself
    started: int  # the leader's start time (clock ticks since boot), 0 without /proc
    sandboxed: bool
    port: int
    socket_dir: Path
    argv: tuple[str, ...]
    endpoint_id: str | None
    cgroup: str | None
    # Its compute units' range (min, max CPUs), for the autoscaler to take it up again after a
    # restart of the platform; None: not autoscaled (or recorded by an earlier version).
    cpu_range: tuple[float, float] | None = None

    def postmaster(self) -> int | None:
        """The postmaster's pid (the one to signal), None when it is gone."""
        if not self.sandboxed:
            return self.leader
        return sandboxed_child(self.leader)


def start_time(pid: int) -> int | None:
    """When ``pid`` started (ticks since boot); None when there is no such live process."""
    if not _HAS_PROC:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return 0
        return 0
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):  # a zombie is gone for our purposes
        return None
    return int(fields[19])


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state is the first, so
    field n of proc(5) is at n - 3); empty when there is no such process."""
    try:
        # The kernel's file; the command name (a tenant may set it) may hold spaces and ")",
        # so split after the last.
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # root's
    except (OSError, IndexError):
        return []


def halted(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP, or held by a tracer): it acts on no signal but
    SIGKILL until it is continued, which its tenant may never do."""
    fields = stat_fields(pid)
    return bool(fields) and fields[0] in ("T", "t")


def is_alive(running: Running) -> bool:
    return start_time(running.leader) == running.started


def children_of(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        return [int(c) for c in children.read_text().split()]  # root's: the kernel's
    except OSError:
        return []


def sandboxed_child(leader: int) -> int | None:
    """The process bwrap's pid 1 runs as pid 2: the postmaster. A tenant's processes that
    outlived their parents are pid 1's children too, but never pid 2 in the namespace."""
    for child in children_of(leader):
        with contextlib.suppress(OSError, ValueError):
            status = Path(f"/proc/{child}/status").read_text()  # root's: the kernel's
            for line in status.splitlines():
                if line.startswith("NSpid:") and line.split()[-1] == "2":
                    return int(child)
    return None


class Records:
    """The records, one file per data directory, with an in-memory cache of them."""

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._cache: dict[Path, Running | None] = {}

    def _path(self, pgdata: Path) -> Path:
        return self._dir / (hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:32] + ".json")

    def get(self, pgdata: Path) -> Running | None:
        """The record of ``pgdata``'s postmaster, whether it still runs or not."""
        if pgdata not in self._cache:
            self._cache[pgdata] = self._load(pgdata)
        return self._cache[pgdata]

    def _load(self, pgdata: Path) -> Running | None:
        try:
            data = json.loads(self._path(pgdata).read_bytes())  # root's: 0700, root's alone
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # a record torn by a crash of the machine: its processes are gone
        if data.get("pgdata") != str(pgdata):
            return None
        data.pop("pgdata")
        data["socket_dir"] = Path(data["socket_dir"])
        data["argv"] = tuple(data["argv"])
        if data.get("cpu_range") is not None:
            low, high = data["cpu_range"]
            data["cpu_range"] = (float(low), float(high))
        return Running(**data)

    def put(self, pgdata: Path, running: Running) -> None:
        self._dir.mkdir(mode=0o700, exist_ok=True)
        data = {**asdict(running), "socket_dir": str(running.socket_dir), "pgdata": str(pgdata)}
        path = self._path(pgdata)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_bytes(json.dumps(data).encode())  # root's
        os.replace(tmp, path)
        self._cache[pgdata] = running

    def drop(self, pgdata: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._path(pgdata).unlink()  # root's
        self._cache[pgdata] = None

    def forget(self) -> None:
        self._cache.clear()
