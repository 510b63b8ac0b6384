"""Start-up reconciliation: make the data plane match the store after a crash.

``pgplane serve`` may have died with postmasters running (they outlive it by design) and
operations half done. Before serving, it:

- ends the leases of operations whose worker was a dead process on this host, so they are
  retried now rather than when the lease runs out (each such attempt counts as failed);
- adopts the postmasters of endpoints the store says are active;
- stops those the store says should not run (suspended, disabled, deleted, unknown);
- records as idle an endpoint the store says is active but that nothing serves;
- starts ``tenant_attach`` for a project the store says is attached whose data is found only in
  the cold archive (restored by hand, or moved between machines), so its data is hot again.

An endpoint with an operation in flight is left to that operation, which converges either way.
Temporary postmasters (roles applied on a branch without a compute) belong to their operations
too: the retry stops and restarts them.
"""

from __future__ import annotations

import logging
import os
import socket

from pgplane.compute.driver import ComputeDriver
from pgplane.core import clock
from pgplane.core.operations import Action
from pgplane.services import operations
from pgplane.store import Store
from pgplane.telemetry import progress

log = logging.getLogger(__name__)


def _dead_here(owner: str) -> bool:
    """Whether a lease owner (``host:pid:nonce``, see Engine.owner) was a process of this host
    that is gone. A live pid may be another pgplane on the same store: its lease stands."""
    parts = owner.rsplit(":", 2)
    if len(parts) != 3 or not parts[1].isdigit():
        return False
    host, pid = parts[0], int(parts[1])
    if host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


async def reconcile(store: Store, driver: ComputeDriver, node: str | None = None) -> None:
    """With ``node``, only the projects placed on it: another node's computes are its own."""
    with progress.step(log, "adopting the computes left running, and what they were doing"):
        await _reconcile(store, driver, node)


async def _reconcile(store: Store, driver: ComputeDriver, node: str | None) -> None:
    now = clock.now_us()
    running = await driver.running_computes()
    async with store.write() as tx:
        unsettled = await tx.list_unsettled_operations(node=node)
        owners = {o.lease_owner for o in unsettled if o.lease_owner is not None}
        dead = sorted(owner for owner in owners if _dead_here(owner))
        if dead:
            count = await tx.expire_leases(owners=dead, now=now)
            log.info("retrying %d operation(s) left running by a stopped pgplane", count)
        mine = None if node is None else await tx.node_project_ids(node)
        endpoints = {
            e.id: e for e in await tx.list_live_endpoints() if mine is None or e.project_id in mine
        }
    busy = {o.endpoint_id for o in unsettled if o.endpoint_id is not None}
    busy_projects = {o.project_id for o in unsettled if o.branch_id is None}

    def settled(endpoint_id: str, project_id: str) -> bool:
        return endpoint_id not in busy and project_id not in busy_projects

    serving = set()
    for found in running:
        if found.endpoint_id is None or not settled(found.endpoint_id, found.project_id):
            continue
        endpoint = endpoints.get(found.endpoint_id)
        if (
            endpoint is not None
            and endpoint.current_state == "active"
            and not endpoint.disabled
            and endpoint.branch_id == found.branch_id
        ):
            serving.add(endpoint.id)
            log.info("adopted the running compute of endpoint %s", endpoint.id)
            continue
        log.info(
            "stopping the compute of endpoint %s: the store says it should not run",
            found.endpoint_id,
        )
        await driver.stop_compute(
            project_id=found.project_id, branch_id=found.branch_id, endpoint_id=found.endpoint_id
        )
    await _attach_archived(
        store, driver, busy_projects | {o.project_id for o in unsettled}, set(endpoints)
    )
    stale = [
        e
        for e in endpoints.values()
        if e.current_state == "active"
        and e.pending_state is None
        and e.id not in serving
        and settled(e.id, e.project_id)
    ]
    if stale:
        async with store.write() as tx:
            for e in stale:
                log.info("endpoint %s has no running compute: recorded as idle", e.id)
                await tx.set_endpoint_state(
                    endpoint_id=e.id, current_state="idle", pending_state=None, now=now
                )


async def _attach_archived(
    store: Store, driver: ComputeDriver, busy: set[str], endpoint_ids: set[str]
) -> None:
    async with store.read() as tx:
        projects = {e.project_id for e in await tx.list_live_endpoints() if e.id in endpoint_ids}
        attached = []
        for project_id in sorted(projects - busy):
            project = await tx.get_project_by_id(project_id)
            if project is not None and project.storage_state == "attached":
                attached.append(project_id)
    for project_id in attached:
        if await driver.tenant_state(project_id=project_id) != "archived":
            continue
        log.info("project %s is attached but its data is archived: attaching it", project_id)
        async with store.write() as tx:
            await operations.start(
                tx, project_id=project_id, starts=[operations.Start(Action.TENANT_ATTACH)]
            )
