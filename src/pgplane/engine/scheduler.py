"""The platform's clock: records activity and starts the operations nobody asks for.

Every ``scheduler_seconds`` it writes the proxy's activity to the store (so a restart neither
postpones nor hastens a suspend: idleness is measured from the stored ``last_active``), suspends
endpoints idle past their timeout, deletes branches whose ``expires_at`` has come (every tick:
one indexed read, so an expiry is late by a tick at most, and a ``serve`` that was down at that
moment deletes the branch at its first tick), deletes expired snapshots and takes the backup
schedules' due snapshots (the same way), and at longer intervals starts
``check_availability`` for branches with a compute and ``tenant_detach`` for projects idle past
``detach_after_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from pgplane import failpoints
from pgplane.compute.driver import ComputeDriver
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Endpoint
from pgplane.core.nodes import DRAINING
from pgplane.core.operations import Action, Status
from pgplane.engine import usage
from pgplane.engine.context import compute_spec
from pgplane.engine.engine import Engine
from pgplane.errors import Conflict, Unavailable
from pgplane.services import backups, moves, scheduled, snapshots
from pgplane.store import Store
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)


class Activity(Protocol):
    """Where connections are counted (the proxy's counters, given by the process that runs both)."""

    def sample(self, now: int) -> dict[str, int]:
        """Endpoints used since the last sample, with when."""
        ...

    def unsampled(self, changed: dict[str, int]) -> None:
        """Give back a sample that could not be recorded, to be taken again."""
        ...


_US = 1_000_000
# How often the slower duties look for due work, at most (they are due far less often).
_SCAN_SECONDS = 60.0


class Scheduler:
    def __init__(
        self,
        *,
        store: Store,
        engine: Engine,
        driver: ComputeDriver,
        settings: Settings,
        activity: Activity,
        metrics: Metrics = NO_METRICS,
        node: str | None = None,
    ) -> None:
        self._store = store
        # With several nodes, each starts the timed work of the projects placed on it, and only
        # those: the work is its computes' and its disk's, and each object has one node, so each
        # job is started once however many nodes run. None: every project.
        self._node = node
        self._mine: set[str] | None = None
        self._metrics = metrics
        self._engine = engine
        self._driver = driver
        self._settings = settings
        self._activity = activity
        self._next_checks = 0.0
        self._next_detach = 0.0
        self._next_usage = 0.0
        self._usage = usage.Sampler(store, driver, self._ours)
        # Endpoints whose compute could not be asked for its activity (warned about once).
        self._unaskable: set[str] = set()
        # Expired branches that may not be deleted (warned about once).
        self._undeletable: set[str] = set()
        # Draining: the project moving now and its detach, and those whose detach failed (left
        # here, named in the log and by `nodes drain`; a restart tries them once more).
        self._moving: tuple[str, str] | None = None
        self._unmovable: set[str] = set()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        due = loop.time()
        while True:
            # Late when the event loop was held (a blocking call, a collector pause): every timer
            # of the process, the proxy's and the API's too, was late by as much.
            self._metrics.scheduler_tick(max(0.0, loop.time() - due))
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Unavailable as exc:  # the store's outage: one line a tick, no trace
                log.warning("scheduler waits for the store: %s", exc.message)
            except Exception:
                log.exception("scheduler tick failed; continuing")
            due = loop.time() + self._settings.scheduler_seconds
            await asyncio.sleep(self._settings.scheduler_seconds)

    async def tick(self) -> None:
        now = clock.now_us()
        changed = self._activity.sample(now)
        if changed:
            try:
                async with self._store.write() as tx:
                    await tx.record_endpoint_activity(list(changed.items()))
            except Unavailable:
                self._activity.unsampled(changed)
                raise
        async with self._store.read() as tx:
            live = await tx.list_live_endpoints()
            self._mine = None if self._node is None else await tx.node_project_ids(self._node)
        live = [e for e in live if self._ours(e.project_id)]
        self._metrics.computes(e.current_state for e in live)
        started = await self._suspend_idle(live, now)
        started += await self._expire(now)
        started += await self._snapshots(now)
        started += await self._drain(now)
        loop_now = asyncio.get_running_loop().time()
        if self._settings.availability_check_seconds > 0 and loop_now >= self._next_checks:
            self._next_checks = loop_now + min(
                _SCAN_SECONDS, self._settings.availability_check_seconds
            )
            started += await self._check_availability(live, now)
        if self._settings.usage_seconds > 0 and loop_now >= self._next_usage:
            self._next_usage = loop_now + self._settings.usage_seconds
            self._usage.start(live)  # apart: a slow disk walk must not delay a suspend
        if self._settings.detach_after_seconds > 0 and loop_now >= self._next_detach:
            self._next_detach = loop_now + min(_SCAN_SECONDS, self._settings.detach_after_seconds)
            started += await self._detach(now)
        if started:
            self._engine.wake()

    def _ours(self, project_id: str) -> bool:
        return self._mine is None or project_id in self._mine

    def _timeout_us(self, endpoint: Endpoint) -> int | None:
        seconds = endpoint.suspend_timeout_seconds
        if seconds < 0:
            return None
        return (seconds or self._settings.default_suspend_timeout_seconds) * _US

    async def _suspend_idle(self, live: list[Endpoint], now: int) -> int:
        started = 0
        for endpoint in live:
            timeout = self._timeout_us(endpoint)
            if (
                timeout is None
                or endpoint.current_state != "active"
                or endpoint.pending_state is not None
            ):
                continue
            idle_before = now - timeout
            if max(endpoint.last_active or 0, endpoint.started_at or 0) >= idle_before:
                continue
            # The proxy saw no use; ask the compute too (clients may connect to it directly, and
            # a session idle in a transaction or waiting on a long query sends nothing).
            try:
                seen = await self._compute_activity(endpoint)
            except Exception as exc:
                # Unknown is not idle: a compute too loaded to answer may be the busiest one.
                # Suspending it would cut its sessions; look again next tick instead.
                if endpoint.id not in self._unaskable:
                    self._unaskable.add(endpoint.id)
                    log.warning("endpoint %s not suspended: %s", endpoint.id, exc)
                continue
            self._unaskable.discard(endpoint.id)
            if seen is not None and seen >= idle_before:
                async with self._store.write() as tx:
                    await tx.record_endpoint_activity([(endpoint.id, seen)])
                continue
            async with self._store.write() as tx:
                op = await scheduled.suspend_idle(
                    tx, endpoint_id=endpoint.id, idle_before=idle_before
                )
            if op is not None:
                log.info("endpoint %s idle for %d s: suspending", endpoint.id, timeout // _US)
                started += 1
        return started

    async def _compute_activity(self, endpoint: Endpoint) -> int | None:
        """The compute's own last activity; raises when it runs but cannot be asked."""
        async with self._store.read() as tx:
            project = await tx.get_project_by_id(endpoint.project_id)
        if project is None:
            return None
        seen = await self._driver.last_activity(compute_spec(project, endpoint))
        return None if seen is None else int(seen * _US)

    async def _expire(self, now: int) -> int:
        async with self._store.read() as tx:
            due = await tx.expired_branches(now=now)
        due = [b for b in due if self._ours(b.project_id)]
        started = 0
        for branch in due:
            await failpoints.reached("expire_branch:due")
            try:
                async with self._store.write() as tx:
                    ops = await scheduled.expire(
                        tx, project_id=branch.project_id, branch_id=branch.id, now=now
                    )
            except Conflict as exc:  # the API keeps this from happening; never delete it anyway
                if branch.id not in self._undeletable:
                    self._undeletable.add(branch.id)
                    log.warning("branch %s expired but is not deleted: %s", branch.id, exc.message)
                continue
            if ops is not None:
                log.info(
                    "branch %s expired at %s: deleting it",
                    branch.id,
                    clock.format_s(branch.expires_at or now),
                )
                started += 1
        return started

    async def _snapshots(self, now: int) -> int:
        """Expired snapshots deleted, and the backup schedules' due slots taken (each read is
        small; a slot is never taken twice: see services/backups.py)."""
        async with self._store.read() as tx:
            expired = await tx.expired_snapshots(now=now, limit=100)
            due = await backups.due_slots(tx, now=now)
        expired = [s for s in expired if self._ours(s.project_id)]
        due = [(p, b) for p, b in due if self._ours(p)]
        started = 0
        for snapshot in expired:
            async with self._store.write() as tx:
                current = await tx.get_snapshot(
                    project_id=snapshot.project_id, snapshot_id=snapshot.id
                )
                if current is None or current.expires_at is None or current.expires_at > now:
                    continue
                await snapshots.remove(tx, snapshot=current)
            log.info("snapshot %s expired: deleting it", snapshot.id)
            started += 1
        for project_id, branch_id in due:
            await failpoints.reached("backup_schedule:due")
            async with self._store.write() as tx:
                ops = await backups.take_due(
                    tx, project_id=project_id, branch_id=branch_id, now=now
                )
            if ops:
                log.info("branch %s: %d scheduled snapshot(s) taken", branch_id, len(ops))
            started += len(ops)
        return started

    async def _check_availability(self, live: list[Endpoint], now: int) -> int:
        interval = int(self._settings.availability_check_seconds * _US)
        async with self._store.read() as tx:
            last = await tx.last_operation_times(Action.CHECK_AVAILABILITY)
        # A branch is first checked one interval after it got its compute.
        since: dict[tuple[str, str], int] = {}
        for e in live:
            if not e.disabled:
                key = (e.project_id, e.branch_id)
                since[key] = min(since.get(key, e.created_at), e.created_at)
        started = 0
        for (project_id, branch_id), created_at in since.items():
            if now - last.get(branch_id, created_at) < interval:
                continue
            async with self._store.write() as tx:
                op = await scheduled.check_availability(
                    tx, project_id=project_id, branch_id=branch_id
                )
            started += op is not None
        return started

    async def _detach(self, now: int) -> int:
        idle_before = now - int(self._settings.detach_after_seconds * _US)
        async with self._store.read() as tx:
            candidates = await tx.detach_candidates(idle_before=idle_before)
        candidates = [p for p in candidates if self._ours(p)]
        started = 0
        for project_id in candidates:
            async with self._store.write() as tx:
                op = await scheduled.detach(tx, project_id=project_id, idle_before=idle_before)
            if op is not None:
                log.info("project %s idle: detaching its storage", project_id)
                started += 1
        return started

    async def _drain(self, now: int) -> int:
        """On a draining node: the next project moved once the last one has settled (one at a
        time, so that a drain never floods the other nodes or the shared storage)."""
        if self._node is None or self._mine is None:
            return 0
        async with self._store.read() as tx:
            node = await tx.get_node(self._node)
            if node is None or node.state != DRAINING:
                return 0
            if self._moving is not None:
                project_id, detach_id = self._moving
                detach = await tx.get_operation(project_id=project_id, operation_id=detach_id)
                if await tx.list_unsettled_operations(project_id=project_id):
                    return 0
                self._moving = None
                if detach is not None and detach.status is Status.FAILED:
                    self._unmovable.add(project_id)
                    log.error(
                        "project %s cannot move off node %s: %s",
                        project_id,
                        self._node,
                        detach.error,
                    )
            candidates = []
            for project_id in sorted(self._mine - self._unmovable):
                project = await tx.get_project_by_id(project_id)
                if project is not None and project.deleted_at is None:
                    candidates.append(project_id)
        for project_id in candidates:
            async with self._store.write() as tx:
                ops = await moves.start_move(tx, project_id=project_id, now=now)
            detach = next((o for o in ops if o.action is Action.TENANT_DETACH), None)
            if detach is not None:
                self._moving = (project_id, detach.id)
                log.info("node %s draining: moving project %s", self._node, project_id)
                return len(ops)
        return 0
