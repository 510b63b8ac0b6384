"""What a compute's run used, by the kernel's accounting: never by anything its tenant wrote.

A tenant holds its compute's OS user (DESIGN §6) and may write anything in its data directory,
so no figure comes from there. With cgroups, a run's CPU time is its cgroup's counter
(``cpuacct.usage`` on v1, ``usage_usec`` of ``cpu.stat`` on v2): everything the compute's
processes used, whichever way they forked, counted by the kernel. The cgroup is made afresh at
each start, so the counter is the run's alone. Without cgroups, it is the CPU time of the
processes under the run's leader (the sandbox's pid 1 or the postmaster) read from ``/proc``:
each live one's own time and what its children that exited used (``cutime``/``cstime``, which
the kernel adds once the parent has waited for them, as the postmaster does for its backends).
That misses a process a tenant detached from the tree, which cgroups do not.

A run is named by its leader's pid and start time, which the kernel never gives to two live
processes at once.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import replace
from pathlib import Path

from pgplane.compute.driver import ComputeUsage
from pgplane.compute.local.postgres.records import Running, children_of, stat_fields
from pgplane.compute.local.tenants.cgroups import Cgroups

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_US = 1_000_000
# After ")" in /proc/<pid>/stat: state is field 3, so field n is at n - 3.
_UTIME, _STIME, _CUTIME, _CSTIME = 11, 12, 13, 14
_ENDED_KEPT = 4  # ended runs remembered per data directory, until a sample takes them


def _boot_us() -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/stat").read_text().splitlines():  # root's: the kernel's
            if line.startswith("btime "):
                return int(line.split()[1]) * _US
    return None


_BOOT_US = _boot_us()


def run_name(record: Running) -> str:
    return f"{record.leader}:{record.started}"


def started_us(record: Running) -> int | None:
    """When the run started, from the leader's start time (ticks since boot)."""
    if _BOOT_US is None or record.started <= 0:
        return None
    return _BOOT_US + record.started * _US // _TICKS


def _own_ticks(pid: int) -> int:
    """A process's CPU ticks and those of its children it waited for; 0 once it is gone."""
    fields = stat_fields(pid)
    try:
        return sum(int(fields[i]) for i in (_UTIME, _STIME, _CUTIME, _CSTIME))
    except (IndexError, ValueError):
        return 0


def process_cpu_seconds(leader: int) -> float:
    """CPU seconds of ``leader`` and every living descendant (with what their exited ones used)."""
    ticks, todo, seen = 0, [leader], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        ticks += _own_ticks(pid)
        todo += children_of(pid)
    return ticks / _TICKS


def measure(record: Running, cgroups: Cgroups | None) -> ComputeUsage:
    """What the run of ``record`` used so far (blocking: reads /proc or cgroup files)."""
    if cgroups is not None and record.cgroup is not None:
        seconds = cgroups.cpu_seconds(record.cgroup)
        if seconds is not None:
            return ComputeUsage(
                run=run_name(record),
                started_us=started_us(record),
                cpu_seconds=seconds,
                measured="cgroup",
                cpus=cgroups.quota_cpus(record.cgroup),
            )
    return ComputeUsage(
        run=run_name(record),
        started_us=started_us(record),
        cpu_seconds=process_cpu_seconds(record.leader),
        measured="processes",
    )


class Ended:
    """The last figures of runs that stopped lately, per data directory, until sampled."""

    def __init__(self) -> None:
        self._runs: dict[Path, list[tuple[str | None, ComputeUsage]]] = {}

    def put(self, pgdata: Path, endpoint_id: str | None, usage: ComputeUsage) -> None:
        ended = replace(usage, ended_us=time.time_ns() // 1000)
        runs = [r for r in self._runs.get(pgdata, []) if r[1].run != usage.run]
        self._runs[pgdata] = [*runs, (endpoint_id, ended)][-_ENDED_KEPT:]

    def of(self, pgdata: Path, endpoint_id: str) -> list[ComputeUsage]:
        return [u for e, u in self._runs.get(pgdata, []) if e == endpoint_id]
