"""Autoscaling: a compute's CPU moves between its minimum and maximum compute units with load.

Neon's computes grow when busy and shrink when idle, within ``autoscaling_limit_min_cu`` and
``autoscaling_limit_max_cu``, without a restart. Here the compute's cgroup quota does: every
few seconds the CPU time each compute used is read from its cgroup; one that used most of its
quota grows by half (at least a quarter CU), one that used little shrinks by a third, never
past its range. A compute starts at its maximum, so a wake is never slowed, and settles to what
its load needs. Memory stays at the maximum (a lower limit under a running Postgres would end
its largest process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from pgplane.compute.local.tenants.cgroups import Cgroups, Limits

log = logging.getLogger(__name__)

INTERVAL = 2.0
_GROW_ABOVE = 0.8  # of its current quota, on average over the interval
_SHRINK_BELOW = 0.3
_STEP_CU = 0.25


def next_cpus(current: float, low: float, high: float, used: float) -> float:
    """The quota after an interval in which the compute used ``used`` CPUs on average."""
    if used >= _GROW_ABOVE * current and current < high:
        return min(high, max(current * 1.5, current + _STEP_CU))
    if used <= _SHRINK_BELOW * current and current > low:
        return max(low, current / 1.5)
    return current


@dataclass(slots=True)
class _Scaled:
    low: float
    high: float
    cpus: float
    seconds: float | None = None  # CPU time used at the last look
    at: float = 0.0  # when that look was, on the clock


class Autoscaler:
    """The computes whose range is wider than a point, and the task that resizes them."""

    def __init__(self, cgroups: Cgroups, clock: Callable[[], float] = time.monotonic) -> None:
        self._cgroups = cgroups
        self._clock = clock
        self._scaled: dict[str, _Scaled] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, cgroup: str, limits: Limits) -> None:
        if limits.min_cpus >= limits.max_cpus:
            self._scaled.pop(cgroup, None)
            return
        self._scaled[cgroup] = _Scaled(limits.min_cpus, limits.max_cpus, limits.cpus)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="autoscale")

    def forget(self, cgroup: str) -> None:
        self._scaled.pop(cgroup, None)

    def cpus(self, cgroup: str) -> float | None:
        scaled = self._scaled.get(cgroup)
        return scaled.cpus if scaled is not None else None

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while self._scaled:
            await asyncio.sleep(INTERVAL)
            try:
                await asyncio.to_thread(self._tick)
            except Exception:  # one bad read must not end autoscaling for every compute
                log.exception("autoscaling")

    def _tick(self) -> None:
        for cgroup, scaled in list(self._scaled.items()):
            seconds, now = self._cgroups.cpu_seconds(cgroup), self._clock()
            if seconds is None:
                continue
            # Over the time since the last look, not the nominal interval: on a busy machine
            # the tick comes late, and the CPU time of a longer span read as a higher use.
            elapsed = now - scaled.at
            if scaled.seconds is not None and elapsed > 0:
                used = max(0.0, seconds - scaled.seconds) / elapsed
                cpus = next_cpus(scaled.cpus, scaled.low, scaled.high, used)
                if cpus != scaled.cpus:
                    with contextlib.suppress(FileNotFoundError):  # stopped meanwhile
                        self._cgroups.set_cpus(cgroup, cpus)
                        scaled.cpus = cpus
            scaled.seconds, scaled.at = seconds, now
