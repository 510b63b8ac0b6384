"""Folding a compute's runs into its totals: only what is new counts, never twice (issue 23)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from pgplane.compute.driver import ComputeDriver, ComputeUsage
from pgplane.compute.model import BranchStorage
from pgplane.core.models import Endpoint
from pgplane.core.usage import HOUR_US, US, BranchSizes, EndpointUsage, StorageTotals, integrate
from pgplane.engine import usage
from pgplane.engine.usage import Sampler, fold
from pgplane.store.sqlite.store import SqliteStore

T0 = 1_000 * HOUR_US  # an hour's start
EMPTY = EndpointUsage(endpoint_id="ep-a", project_id="p", branch_id="br")


def _run(name: str, started: int, cpu: float, *, ended: int | None = None) -> ComputeUsage:
    return ComputeUsage(
        run=name, started_us=started, cpu_seconds=cpu, measured="cgroup", cpus=2.0, ended_us=ended
    )


def test_a_run_adds_what_it_used_since_its_start_and_then_only_what_is_new() -> None:
    kept, hours = fold(EMPTY, _run("1:1", T0, 3.0), now_us=T0 + 10 * US, default_cpus=1)
    assert (kept.cpu_us, kept.active_us, kept.cu_us) == (3 * US, 10 * US, 20 * US)
    assert [(h.hour, h.cpu_us, h.active_us) for h in hours] == [(T0 // US, 3 * US, 10 * US)]
    again, more = fold(kept, _run("1:1", T0, 5.0), now_us=T0 + 20 * US, default_cpus=1)
    assert (again.cpu_us, again.active_us, again.cu_us) == (5 * US, 20 * US, 40 * US)
    assert sum(h.cpu_us for h in more) == 2 * US


def test_a_reading_seen_twice_or_late_adds_nothing() -> None:
    kept, _ = fold(EMPTY, _run("1:1", T0, 3.0), now_us=T0 + 10 * US, default_cpus=1)
    same, hours = fold(kept, _run("1:1", T0, 3.0), now_us=T0 + 10 * US, default_cpus=1)
    assert same == kept and hours == []
    late, _ = fold(kept, _run("1:1", T0, 2.0), now_us=T0 + 5 * US, default_cpus=1)
    assert (late.cpu_us, late.active_us) == (kept.cpu_us, kept.active_us)


def test_an_ended_run_stops_growing_and_an_older_run_is_not_counted_again() -> None:
    ended = _run("1:1", T0, 4.0, ended=T0 + 30 * US)
    kept, _ = fold(EMPTY, ended, now_us=T0 + 40 * US, default_cpus=1)
    later, _ = fold(kept, ended, now_us=T0 + 4000 * US, default_cpus=1)  # suspended an hour
    assert later == kept and kept.active_us == 30 * US
    newer, _ = fold(kept, _run("2:9", T0 + 100 * US, 1.0), now_us=T0 + 110 * US, default_cpus=1)
    assert (newer.cpu_us, newer.active_us) == (5 * US, 40 * US)
    old, hours = fold(newer, ended, now_us=T0 + 120 * US, default_cpus=1)
    assert old == newer and hours == []


def test_time_across_an_hour_is_spread_over_both() -> None:
    start = T0 + HOUR_US - 30 * US
    kept, hours = fold(EMPTY, _run("1:1", start, 6.0), now_us=start + 60 * US, default_cpus=1)
    assert [(h.hour - T0 // US, h.cpu_us, h.active_us) for h in hours] == [
        (0, 3 * US, 30 * US),
        (3600, 3 * US, 30 * US),
    ]
    assert kept.cpu_us == 6 * US


def test_without_a_quota_compute_time_is_at_the_compute_s_size() -> None:
    reading = ComputeUsage(run="1:1", started_us=T0, cpu_seconds=0.5, measured="processes")
    kept, _ = fold(EMPTY, reading, now_us=T0 + 10 * US, default_cpus=0.25)
    assert kept.cu_us == int(2.5 * US)


async def test_a_sample_never_outlives_the_task_that_started_it(tmp_path: Path) -> None:
    """A slow sample (a disk walk) runs apart from the scheduler's tick, and ends with it."""
    store = SqliteStore(tmp_path / "pgplane.db")
    reading = asyncio.Event()

    class Slow:
        async def compute_usage(self, **_: str) -> list[ComputeUsage]:
            reading.set()
            await asyncio.Event().wait()  # a reading that never comes
            return []

    sampler = Sampler(store, cast("ComputeDriver", Slow()))
    endpoint = cast("Endpoint", SimpleNamespace(id="ep-a", project_id="p", branch_id="br"))

    async def scheduler() -> None:
        sampler.start([endpoint])
        await asyncio.Event().wait()

    owner = asyncio.create_task(scheduler())
    await reading.wait()
    owner.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await owner
    task = sampler._task
    assert task is not None
    with contextlib.suppress(asyncio.CancelledError):
        async with asyncio.timeout(10):  # a sample left running would hang here: fail instead
            await task
    assert task.cancelled()
    await store.close()


def test_with_an_object_store_the_history_counts_as_its_objects_take_there() -> None:
    """Synthetic storage counts a branch's history where it is kept: its objects' bytes once
    known (sealed: compressed), its disk's before; archived bytes are integrated over time."""
    kept = BranchSizes("p-1", "br-1", 100, 500, 1000, 0, archived=300)
    unknown = BranchSizes("p-1", "br-2", 10, 50, 70, 0)
    total = StorageTotals.of(kept) + StorageTotals.of(unknown)
    assert total.synthetic == (100 + 300) + (10 + 70)
    assert total.history == 1070  # on this disk, as before
    (hour,) = integrate(kept, end=2 * US)
    assert hour.archived_byte_s == 600
    sizes, _ = usage.sizes_now(
        kept,
        BranchStorage(logical=None, data=None, history=None, archived_at=5, archived_bytes=None),
        project_id="p-1",
        branch_id="br-1",
        now_us=US,
    )
    assert (sizes.archived, sizes.archived_at) == (300, 5)  # what was not read now kept
