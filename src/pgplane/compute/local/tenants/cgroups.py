"""A cgroup per compute: its CPU, memory and processes bounded by its compute units.

A Neon compute unit is 1 vCPU and 4 GB of RAM. A compute may use up to its
``autoscaling_limit_max_cu``: a CPU quota of that many CPUs at most (with a burst of one period,
so a short query is not throttled; :mod:`.autoscale` moves it within the compute's range), that
much memory (the kernel reclaims its cache, then
ends its largest process), and a cap on processes (its connections and Postgres' own workers,
plus a margin for what a tenant runs). Its CPU weight follows its size, so under contention
computes share the machine in proportion to their CU and no tenant's process count buys more.

Both cgroup versions are served:

- **v2** (``/sys/fs/cgroup`` is cgroup2, as on most machines): computes go under
  ``<our cgroup>/computes/<name>``; as v2 allows controllers only in cgroups without processes,
  pgplane first moves itself to ``<our cgroup>/serve`` (systemd's ``Delegate=yes`` gives a
  service such a subtree). ``cpu.max``, ``cpu.weight``, ``memory.max``, ``pids.max``; killed
  with ``cgroup.kill``.
- **v1** (separate ``cpu``, ``memory`` and ``pids`` hierarchies): ``<our cgroup>/pgplane-computes
  /<name>`` in each; ``cpu.cfs_quota_us``, ``cpu.shares``, ``memory.limit_in_bytes``,
  ``pids.max``; killed by signalling every process listed until none is.

A compute joins by its processes' pids written to each ``cgroup.procs`` (:meth:`join_tree`),
while Postgres starts and before its first client: what it forks afterwards is born inside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

_GIB = 1024**3
_PERIOD_US = 100_000
_V1_CONTROLLERS = ("cpu", "memory", "pids")
_V1_USAGE = "cpuacct"  # where v1 counts CPU time (often mounted with cpu, here apart)
_KILL_WAIT = 5.0
_EXTRA_PROCESSES = 100  # Postgres' own workers, and a tenant's shell or two


@dataclass(frozen=True, slots=True)
class Limits:
    cpus: float  # what it may use now: between min_cpus and max_cpus, moved by the autoscaler
    memory_bytes: int
    processes: int
    min_cpus: float = 0.0  # 0: as cpus (no autoscaling)
    max_cpus: float = 0.0

    @classmethod
    def for_size(cls, max_cu: float, max_connections: int, min_cu: float | None = None) -> Limits:
        """A compute that may use ``min_cu`` to ``max_cu``: it starts at its maximum (a wake is
        never slowed), the autoscaler moves it within the range with its load; its memory is
        the maximum's throughout (shrinking memory under a running Postgres would end it)."""
        return cls(
            cpus=max_cu,
            memory_bytes=int(max_cu * 4 * _GIB),
            processes=max_connections + _EXTRA_PROCESSES,
            min_cpus=min(min_cu, max_cu) if min_cu is not None else max_cu,
            max_cpus=max_cu,
        )


# Work the platform does on a tenant's data with the tenant's code or WAL (a schema-only
# branch's restore, a point read's replay): in a cgroup of the smallest compute's size, as a
# tenant's own work always is, never with the whole machine.
PLATFORM_WORK = Limits.for_size(0.25, max_connections=20)
# A branch or restore at a point replays the tenant's WAL too, but a user waits on it as on a
# wake: a compute of 1 CU (an account runs two at most, in its long-operation slots).
REPLAY_WORK = Limits.for_size(1, max_connections=20)


def _own_cgroup(controller: str) -> str:
    """Our cgroup path in ``controller``'s hierarchy ("" names v2's)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():  # root's: the kernel's
            _, controllers, path = line.split(":", 2)
            if controller in controllers.split(","):
                return path
    return "/"


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where computes' cgroups live: one parent per hierarchy (one on v2, three on v1)."""

    version: int
    parents: tuple[Path, ...]

    @classmethod
    def find(cls, root: Path = Path("/sys/fs/cgroup")) -> tuple[Cgroups | None, str]:
        """This machine's cgroups for computes, or None and why not (said at start-up)."""
        if os.geteuid() != 0:
            return None, "pgplane is not root"
        try:
            if (root / "cgroup.controllers").exists():
                return cls._v2(root), "cgroup v2"
            if all((root / c / "cgroup.procs").exists() for c in _V1_CONTROLLERS):
                return cls._v1(root), "cgroup v1 (cpu, memory, pids)"
        except OSError as exc:
            return None, f"cgroups unusable: {exc}"
        return None, "no cgroup v2 and no v1 cpu, memory and pids controllers"

    @classmethod
    def _v1(cls, root: Path) -> Cgroups:
        parents = []
        usage = [_V1_USAGE] if (root / _V1_USAGE / "cgroup.procs").exists() else []
        for controller in (*_V1_CONTROLLERS, *usage):
            own = _own_cgroup(controller).strip("/")
            parent = root / controller / own / "pgplane-computes"
            parent.mkdir(exist_ok=True)
            parents.append(parent)
        return cls(version=1, parents=tuple(parents))

    @classmethod
    def _v2(cls, root: Path) -> Cgroups:
        own = root / _own_cgroup("").strip("/")
        wanted = {"cpu", "memory", "pids"}
        available = set((own / "cgroup.controllers").read_text().split())  # root's: the kernel's
        if not wanted <= available:
            raise OSError(f"{own} lacks controllers {sorted(wanted - available)}")
        if (own / "cgroup.procs").read_text().split():  # root's: the kernel's
            # No controllers in a cgroup with processes of its own: we move to a leaf first.
            serve = own / "serve"
            serve.mkdir(exist_ok=True)
            for pid in (own / "cgroup.procs").read_text().split():  # root's: the kernel's
                with contextlib.suppress(OSError):  # exited meanwhile
                    (serve / "cgroup.procs").write_text(pid)
        (own / "cgroup.subtree_control").write_text("+cpu +memory +pids")
        parent = own / "computes"
        parent.mkdir(exist_ok=True)
        (parent / "cgroup.subtree_control").write_text("+cpu +memory +pids")
        return cls(version=2, parents=(parent,))

    def procs_files(self, name: str) -> list[Path]:
        """The ``cgroup.procs`` files a process writes its pid to, to join compute ``name``."""
        return [parent / name / "cgroup.procs" for parent in self.parents]

    def create(self, name: str, limits: Limits) -> None:
        """The compute's cgroup, with its limits (set again if it exists)."""
        for parent in self.parents:
            (parent / name).mkdir(exist_ok=True)
        self.set_limits(name, limits)

    def recreate(self, name: str, limits: Limits) -> None:
        """A fresh cgroup for a compute: whatever an earlier one left in it ended first."""
        self.kill(name)
        self.create(name, limits)

    def set_limits(self, name: str, limits: Limits) -> None:
        self.set_cpus(name, limits.cpus)
        if self.version == 2:
            group = self.parents[0] / name
            _write(group / "memory.max", str(limits.memory_bytes))
            _write(group / "pids.max", str(limits.processes))
            return
        _, memory, pids = (parent / name for parent in self.parents[:3])
        _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
        _write(pids / "pids.max", str(limits.processes))

    def set_cpus(self, name: str, cpus: float) -> None:
        """The CPU quota (with a burst of one period) and the weight of ``cpus`` CPUs."""
        quota = max(1000, int(cpus * _PERIOD_US))
        weight = max(1, round(cpus * 100))
        # The burst may never exceed the quota: it goes to 0 first, so shrinking is allowed.
        if self.version == 2:
            group = self.parents[0] / name
            _write(group / "cpu.max.burst", "0", optional=True)
            _write(group / "cpu.max", f"{quota} {_PERIOD_US}")
            _write(group / "cpu.max.burst", str(quota), optional=True)
            _write(group / "cpu.weight", str(min(10000, weight)))
            return
        cpu = self.parents[0] / name
        _write(cpu / "cpu.cfs_burst_us", "0", optional=True)
        _write(cpu / "cpu.cfs_period_us", str(_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(quota))
        _write(cpu / "cpu.cfs_burst_us", str(quota), optional=True)
        _write(cpu / "cpu.shares", str(max(2, weight * 1024 // 100)))

    def quota_cpus(self, name: str) -> float | None:
        """The CPUs its quota allows now; None without one (or without the cgroup)."""
        try:
            if self.version == 2:
                cpu_max = self.parents[0] / name / "cpu.max"
                quota, period = cpu_max.read_text().split()  # root's: the kernel's
            else:
                cpu = self.parents[0] / name
                quota = (cpu / "cpu.cfs_quota_us").read_text()  # root's: the kernel's
                period = (cpu / "cpu.cfs_period_us").read_text()  # root's: the kernel's
            return None if quota.strip() in ("max", "-1") else int(quota) / int(period)
        except (OSError, ValueError):
            return None

    def cpu_seconds(self, name: str) -> float | None:
        """CPU time the compute used so far, None where this machine does not count it."""
        try:
            if self.version == 2:
                stat = (self.parents[0] / name / "cpu.stat").read_text()  # root's: the kernel's
                fields = dict(line.split() for line in stat.splitlines())
                return int(fields["usage_usec"]) / 1e6
            if len(self.parents) > len(_V1_CONTROLLERS):
                usage = self.parents[-1] / name / "cpuacct.usage"
                return int(usage.read_text()) / 1e9  # root's: the kernel's
        except (OSError, KeyError, ValueError):
            return None
        return None

    def join_tree(self, name: str, root: int) -> None:
        """Move ``root`` and all its descendants into compute ``name``'s cgroup (blocking).

        Each hierarchy is checked on its own (v1 has one per controller): a process forked
        between its parent's moves into two of them is born in the first and outside the
        second, and would stay there (its memory uncapped) if being in any counted as in."""
        deadline = time.monotonic() + _KILL_WAIT
        while True:
            tree = _tree(root)
            outside = {procs: tree - _listed(procs) for procs in self.procs_files(name)}
            if not any(outside.values()):
                return
            for procs, missing in outside.items():
                for pid in missing:
                    with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                        _move(procs, pid)
            if time.monotonic() > deadline:
                missed = sorted(set[int]().union(*outside.values()))
                raise OSError(f"processes {missed} of compute {name} would not move")

    def pids(self, name: str) -> set[int]:
        """Every process in any of the compute's hierarchies."""
        return set[int]().union(*(_listed(procs) for procs in self.procs_files(name)))

    def kill(self, name: str) -> None:
        """End every process of the compute and remove its cgroup (blocking: run in a thread).

        Nothing of a tenant outlives its compute: not a background process its shell left, not
        one that forks as fast as it is killed (v1 repeats until the list is empty)."""
        group = self.parents[0] / name
        if self.version == 2 and (group / "cgroup.kill").exists():
            _write(group / "cgroup.kill", "1")
        deadline = time.monotonic() + _KILL_WAIT
        while pids := self.pids(name):
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise OSError(f"processes {sorted(pids)} of compute {name} survived SIGKILL")
            time.sleep(0.01)
        for parent in self.parents:
            with contextlib.suppress(FileNotFoundError):
                (parent / name).rmdir()

    def names(self) -> Iterable[str]:
        with contextlib.suppress(FileNotFoundError):
            for entry in self.parents[0].iterdir():
                if entry.is_dir():
                    yield entry.name


def _listed(procs: Path) -> set[int]:
    """The pids a ``cgroup.procs`` lists (none when the cgroup is gone)."""
    try:
        return {int(p) for p in procs.read_text().split()}  # root's: the kernel's
    except FileNotFoundError:
        return set()


def _move(procs: Path, pid: int) -> None:
    """Into the cgroup of ``procs``: the kernel moves a process whose pid is written there."""
    procs.write_text(str(pid))  # root's: the kernel's


def _tree(root: int) -> set[int]:
    """``root`` and its living descendants (none when it is gone)."""
    found: set[int] = set()
    todo = [root]
    while todo:
        pid = todo.pop()
        tasks = Path(f"/proc/{pid}/task")
        try:
            # root's: the kernel's
            children = [c for t in tasks.iterdir() for c in (t / "children").read_text().split()]
        except OSError:
            continue  # exited meanwhile
        found.add(pid)
        todo += [int(c) for c in children]
    return found


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        path.write_text(value)  # root's: the kernel's cgroup files
    except FileNotFoundError:
        if not optional:
            raise
