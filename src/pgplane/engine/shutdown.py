"""What ``serve`` does with the computes as it stops.

By default they keep running: postmasters outlive the platform's process by design, the next
start adopts them, and their clients are not cut by a restart of the platform. The operator is
told which. With ``--stop-computes`` each active endpoint is suspended as idle suspend does it
(a ``suspend_compute`` operation, recorded, with the engine still running to carry it out)
before the engine stops.
"""

from __future__ import annotations

import asyncio
import logging

from pgplane.compute.driver import ComputeDriver
from pgplane.core.models import Operation
from pgplane.engine.engine import Engine
from pgplane.services import scheduled
from pgplane.store import Store
from pgplane.telemetry import progress

log = logging.getLogger(__name__)

_POLL_SECONDS = 0.1


async def suspend_all(store: Store, engine: Engine) -> list[Operation]:
    """Suspend every active endpoint once; their operations as they ended. An endpoint with
    an operation under way (a start, a restart) is suspended once that is done. Under the
    caller's ``asyncio.timeout``: what is not done by then, the next start carries on with."""
    with progress.step(log, "suspending the running computes before stopping"):
        return await _suspend_all(store, engine)


async def _suspend_all(store: Store, engine: Engine) -> list[Operation]:
    started: dict[str, Operation] = {}
    while True:
        async with store.write() as tx:
            # Only this node's computes: the other nodes' keep running.
            mine = None if engine.node is None else await tx.node_project_ids(engine.node)
            tried = {op.endpoint_id for op in started.values() if op.endpoint_id}
            fresh = await scheduled.suspend_for_stop(tx, tried=tried, mine=mine)
        if fresh:
            log.info("suspending %d compute(s) before stopping", len(fresh))
            started.update((op.id, op) for op in fresh)
            engine.wake()
        async with store.read() as tx:
            ops = [
                await tx.get_operation(project_id=op.project_id, operation_id=op.id) or op
                for op in started.values()
            ]
            waiting = (
                set(await scheduled.active_endpoints(tx, mine))
                - tried
                - {op.endpoint_id for op in fresh}
            )
        if not waiting and all(op.status.settled for op in ops):
            return ops
        await asyncio.sleep(_POLL_SECONDS)


async def report_running(driver: ComputeDriver) -> None:
    """Say which computes stay running past this process, and what becomes of them."""
    running = [c for c in await driver.running_computes() if c.endpoint_id is not None]
    if not running:
        return
    names = ", ".join(sorted(str(c.endpoint_id) for c in running))
    log.warning(
        "leaving %d compute(s) running: %s; the next 'pgplane serve' on this data directory"
        " adopts them (start it with --stop-computes to stop them with it)",
        len(running),
        names,
    )
