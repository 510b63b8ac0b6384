"""Compute usage folded from the driver's readings into the store (core/usage.py says what is
kept).

Folding adds only what is new since the reading kept: a reading seen twice, or an older one
arriving after a newer one, adds nothing; a run newer than the one kept adds all it used since
its start. Totals grow only with a run's own figures, so never while the compute is suspended;
they survive the compute's restarts (each is a new run) and the platform's (the kept run is
taken up where it stood). The scheduler samples running computes every ``usage_seconds``; a
suspend records its compute's last figures, read by the driver as it stopped.

Storage is sampled on the same tick for the branches whose compute runs (their data changes),
and every ``_STORAGE_EVERY`` ticks for all (history is taken and freed without a compute). A
branch's logical size is known only while its compute runs; the last one is kept meanwhile.
Between samples a branch is taken to hold what it was last seen to: that is what the hourly
records integrate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace

from pgplane.compute.driver import BranchStorage, ComputeDriver, ComputeUsage
from pgplane.core import clock
from pgplane.core.models import Endpoint
from pgplane.core.usage import (
    HOUR_US,
    US,
    BranchSizes,
    EndpointUsage,
    HourUsage,
    integrate,
    spread,
)
from pgplane.errors import Unavailable
from pgplane.store import Store, Tx

log = logging.getLogger(__name__)

_STORAGE_EVERY = 10  # ticks between samples of every branch's storage
# Hourly records kept: the consumption history answers a year of months at most (as Neon's),
# and a little more so the oldest month is whole.
KEEP_HOURS = 400 * 24


def fold(
    kept: EndpointUsage, reading: ComputeUsage, *, now_us: int, default_cpus: float
) -> tuple[EndpointUsage, list[HourUsage]]:
    """``kept`` with what ``reading`` adds, and the same spread over the hours it fell in."""
    end = reading.ended_us if reading.ended_us is not None else now_us
    cpu_us = int(reading.cpu_seconds * US)
    started = reading.started_us if reading.started_us is not None else end
    if reading.run == kept.run:
        cpu_delta = max(0, cpu_us - kept.run_cpu_us)
        since = kept.run_seen_us
        started = kept.run_started_us
        run_cpu, seen = max(cpu_us, kept.run_cpu_us), max(end, kept.run_seen_us)
    elif kept.run is None or started > kept.run_started_us:
        cpu_delta, since, run_cpu, seen = cpu_us, started, cpu_us, end
    else:
        return kept, []  # a run older than the one kept: folded already
    wall = max(0, end - since)
    cpus = reading.cpus if reading.cpus is not None else default_cpus
    cu_delta = int(wall * cpus)
    updated = replace(
        kept,
        run=reading.run,
        run_started_us=started,
        run_cpu_us=run_cpu,
        run_seen_us=seen,
        cpu_us=kept.cpu_us + cpu_delta,
        active_us=kept.active_us + wall,
        cu_us=kept.cu_us + cu_delta,
    )
    hours = spread(kept, start=end - wall, end=end, cpu_us=cpu_delta, cu_us=cu_delta)
    return updated, hours


# A deleted endpoint's size is not kept: its last run is counted at Neon's smallest (without a
# cgroup's quota to say better).
DELETED_CPUS = 0.25


async def record(
    tx: Tx,
    readings: Sequence[ComputeUsage],
    *,
    endpoint_id: str,
    project_id: str,
    branch_id: str,
    default_cpus: float,
    now_us: int,
) -> None:
    """Fold an endpoint's readings (oldest run first) into what the store keeps of it."""
    if not readings:
        return
    kept = await tx.get_endpoint_usage(endpoint_id) or EndpointUsage(
        endpoint_id=endpoint_id, project_id=project_id, branch_id=branch_id
    )
    before, hours = kept, list[HourUsage]()
    if kept.branch_id != branch_id:
        # The endpoint moved (a finalized restore): its runs count for the branch whose data
        # they served, the old one's when it stopped there, the new one's from then on.
        kept = replace(kept, branch_id=branch_id)
    for reading in readings:
        kept, more = fold(kept, reading, now_us=now_us, default_cpus=default_cpus)
        hours += more
    if kept != before or hours:
        await tx.put_endpoint_usage(kept, hours)


async def record_endpoint(
    tx: Tx, endpoint: Endpoint, readings: Sequence[ComputeUsage], *, now_us: int
) -> None:
    await record(
        tx,
        readings,
        endpoint_id=endpoint.id,
        project_id=endpoint.project_id,
        branch_id=endpoint.branch_id,
        default_cpus=endpoint.autoscaling_limit_max_cu,
        now_us=now_us,
    )


async def read(driver: ComputeDriver, endpoint: Endpoint) -> Sequence[ComputeUsage]:
    return await driver.compute_usage(
        project_id=endpoint.project_id, branch_id=endpoint.branch_id, endpoint_id=endpoint.id
    )


async def sample(store: Store, driver: ComputeDriver, endpoints: Sequence[Endpoint]) -> None:
    """Read every endpoint's runs and record them, in one write."""
    taken: list[tuple[Endpoint, Sequence[ComputeUsage]]] = []
    for endpoint in endpoints:
        try:
            readings = await read(driver, endpoint)
        except Exception as exc:  # one compute's figures unreadable: the others still count
            log.warning("usage of endpoint %s not read: %s", endpoint.id, exc)
            continue
        if readings:
            taken.append((endpoint, readings))
    if not taken:
        return
    now = clock.now_us()
    async with store.write() as tx:
        for endpoint, readings in taken:
            await record_endpoint(tx, endpoint, readings, now_us=now)


def sizes_now(
    kept: BranchSizes | None, got: BranchStorage, *, project_id: str, branch_id: str, now_us: int
) -> tuple[BranchSizes, list[HourUsage]]:
    """The branch's sizes with what was just read (what was not known now kept as it was), and
    its storage over the time since the last sample."""

    def pick(new: int | None, old: int | None) -> int | None:
        return new if new is not None else old

    before = kept.wal_lsn if kept else None
    written = kept.written if kept else 0
    grown = 0
    if got.wal_lsn is not None and before is not None:
        # Only forward: a restore puts the branch back at an earlier position, from which its
        # new writes count again.
        grown = max(0, got.wal_lsn - before)
        written += grown
    sizes = BranchSizes(
        project_id=project_id,
        branch_id=branch_id,
        logical=pick(got.logical, kept.logical if kept else None),
        data=pick(got.data, kept.data if kept else None),
        history=pick(got.history, kept.history if kept else None),
        sampled_us=now_us,
        wal_lsn=pick(got.wal_lsn, before),
        written=written,
        archived_at=pick(got.archived_at, kept.archived_at if kept else None),
        archived=pick(got.archived_bytes, kept.archived if kept else None),
        # What waits now, as read: a branch whose archive is not known here waits for nothing.
        unarchived=got.unarchived_bytes,
        unarchived_since=got.unarchived_since,
    )
    hours = [] if kept is None else integrate(kept, end=now_us)
    if grown:
        hour = now_us // HOUR_US * 3600
        hours.append(HourUsage(project_id, branch_id, hour, written_bytes=grown))
    return sizes, hours


async def sample_storage(
    store: Store, driver: ComputeDriver, branches: Sequence[tuple[str, str]]
) -> None:
    """Read what each branch takes and record it, in one write."""
    taken: list[tuple[str, str, BranchStorage]] = []
    for project_id, branch_id in branches:
        try:
            got = await driver.branch_storage(project_id=project_id, branch_id=branch_id)
        except Exception as exc:  # one branch unreadable: the others still count
            log.warning("storage of branch %s not read: %s", branch_id, exc)
            continue
        taken.append((project_id, branch_id, got))
    if not taken:
        return
    now = clock.now_us()
    async with store.write() as tx:
        for project_id, branch_id, got in taken:
            await record_sizes(tx, got, project_id=project_id, branch_id=branch_id, now_us=now)


async def record_sizes(
    tx: Tx, got: BranchStorage, *, project_id: str, branch_id: str, now_us: int
) -> None:
    kept = await tx.get_branch_sizes(branch_id)
    sizes, hours = sizes_now(kept, got, project_id=project_id, branch_id=branch_id, now_us=now_us)
    await tx.put_branch_sizes(sizes, hours)


class Sampler:
    """The scheduler's usage duty: computes every tick, storage as the module says."""

    def __init__(
        self, store: Store, driver: ComputeDriver, ours: Callable[[str], bool] = lambda _: True
    ) -> None:
        self._store = store
        self._driver = driver
        self._ours = ours  # a project placed on this node (its data is here to measure)
        self._ticks = 0
        self._task: asyncio.Task[None] | None = None
        self._owner: asyncio.Task[object] | None = None

    def start(self, live: Sequence[Endpoint]) -> None:
        """Sample in a task of its own, unless the last sample still runs; it ends with the
        task that started it (the scheduler's), never outliving it."""
        if self._owner is None and (owner := asyncio.current_task()) is not None:
            self._owner = owner
            owner.add_done_callback(lambda _: self.stop())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._tick(live), name="usage sample")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _tick(self, live: Sequence[Endpoint]) -> None:
        try:
            await self.tick(live)
        except Unavailable as exc:
            log.warning("usage not recorded: %s", exc.message)
        except Exception:
            log.exception("usage sample failed; next one as usual")

    async def tick(self, live: Sequence[Endpoint]) -> None:
        await sample(self._store, self._driver, live)
        if self._ticks % _STORAGE_EVERY == 0:
            async with self._store.write() as tx:
                branches = [b for b in await tx.storage_targets() if self._ours(b[0])]
                await tx.prune_usage_hours(before_hour=clock.now_us() // US - KEEP_HOURS * 3600)
        else:
            running = {(e.project_id, e.branch_id) for e in live if e.current_state == "active"}
            branches = sorted(running)
        self._ticks += 1
        await sample_storage(self._store, self._driver, branches)
