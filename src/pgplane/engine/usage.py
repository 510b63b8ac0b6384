"""Compute usage folded from the driver's readings into the store (core/usage.py says what is
kept).

Folding adds only what is new since the reading kept: a reading seen twice, or an older one
arriving after a newer one, adds nothing; a run newer than the one kept adds all it used since
its start. Totals grow only with a run's own figures, so never while the compute is suspended;
they survive the compute's restarts (each is a new run) and the platform's (the kept run is
taken up where it stood). The scheduler samples running computes every ``usage_seconds``; a
suspend records its compute's last figures, read by the driver as it stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from pgplane.compute.driver import ComputeDriver, ComputeUsage
from pgplane.core import clock
from pgplane.core.models import Endpoint
from pgplane.core.usage import US, EndpointUsage, HourUsage, spread
from pgplane.store import Store, Tx

log = logging.getLogger(__name__)


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


async def record(
    tx: Tx, endpoint: Endpoint, readings: Sequence[ComputeUsage], *, now_us: int
) -> None:
    """Fold an endpoint's readings (oldest run first) into what the store keeps of it."""
    if not readings:
        return
    kept = await tx.get_endpoint_usage(endpoint.id) or EndpointUsage(
        endpoint_id=endpoint.id, project_id=endpoint.project_id, branch_id=endpoint.branch_id
    )
    before, hours = kept, list[HourUsage]()
    for reading in readings:
        kept, more = fold(
            kept, reading, now_us=now_us, default_cpus=endpoint.autoscaling_limit_max_cu
        )
        hours += more
    if kept != before or hours:
        await tx.put_endpoint_usage(kept, hours)


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
            await record(tx, endpoint, readings, now_us=now)
