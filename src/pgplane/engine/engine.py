"""The dispatcher: finds claimable operations, claims them with a lease, runs their handlers.

One dispatcher per process runs up to ``settings.workers`` attempts at once, and as many of the
long actions (copies, replays, packing: ``LONG_ACTIONS``) beside them, one per project at a time,
so that a project's copies can neither delay other projects' short work (a wake waiting behind
an hour of another tenant's replay) nor take every copy slot. An account's attempts hold at most
half the long slots and all but one of the others, so that no account's work, however slow it
makes itself, queues another account's. Claims are
compare-and-set in the store, so several processes (or replicas of the control plane later) can
run dispatchers against one store without running an attempt twice; with several nodes, each
claims only the operations of the projects placed on it. A worker that dies leaves a
``running`` operation whose lease expires; the next dispatcher to look claims it again and counts
the abandoned attempt as a failure. An attempt that hangs (its worker alive, its handler never
returning) is cancelled after ``attempt_timeout_seconds`` and counted as a failure the same way.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

import msgspec

from pgplane import failpoints
from pgplane.compute.driver import ComputeDriver, ComputeError
from pgplane.config import Settings
from pgplane.core import aio, clock
from pgplane.core.models import Operation
from pgplane.core.operations import (
    LONG_ACTIONS,
    Action,
    RetryPolicy,
    Status,
    check_transition,
    claimable,
)
from pgplane.core.scrub import scrub
from pgplane.engine.context import Context, Handler, PermanentError
from pgplane.engine.handlers import GIVEN_UP, HANDLERS
from pgplane.engine.pacing import StartPacing
from pgplane.errors import PgplaneError, Unavailable
from pgplane.store import Store, Tx
from pgplane.telemetry import logs
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

_US = 1_000_000
_RECORD_PAUSE_CAP = 2.0  # seconds between tries to record an outcome while the store is down
_ACCOUNTS_KEPT = 100_000  # projects whose account is remembered (a map cleared past it)


def _took_ms(op: Operation, started: int, now: int) -> int:
    """How long ``op`` has taken by ``now``, the attempt that began at ``started`` included: from
    its first start, so the pauses between retries (and an abandoned attempt's lease) count.

    An operation claimed before the first start was recorded has only the sum of its attempts;
    the larger of the two is the nearer to the truth.
    """
    attempts = op.total_duration_ms + (now - started) // 1000
    if op.started_at is None:
        return attempts
    return max(attempts, (now - op.started_at) // 1000)


class AttemptTimedOut(Exception):
    """An attempt ran past ``attempt_timeout_seconds`` and was cancelled; it is retried."""


class Engine:
    def __init__(
        self,
        *,
        store: Store,
        driver: ComputeDriver,
        settings: Settings,
        handlers: dict[Action, Handler] | None = None,
        metrics: Metrics = NO_METRICS,
        node: str | None = None,
    ) -> None:
        self._store = store
        # On a platform of several nodes, this engine claims only the operations of the projects
        # placed on its node (their computes and data are here); None: every operation.
        self.node = node
        self._metrics = metrics
        self._settings = settings
        self._context = Context(store=store, driver=driver, settings=settings)
        self._handlers: dict[Action, Handler] = dict(HANDLERS if handlers is None else handlers)
        self._policy = RetryPolicy(
            max_attempts=settings.max_attempts,
            base_seconds=settings.retry_base_seconds,
            cap_seconds=settings.retry_cap_seconds,
        )
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(settings.workers)
        self._long_slots = asyncio.Semaphore(settings.workers)
        self._long_projects: set[str] = set()  # projects with a long attempt running here
        # What each account's attempts hold here, and at most: one account's work (a flood of
        # stopped postmasters' suspends, slow builds its own SQL makes slow) never takes every
        # slot of a kind, so another account's wake or copy always has one.
        self._held: collections.Counter[tuple[str, bool]] = collections.Counter()
        self._caps = {False: max(1, settings.workers - 1), True: max(1, settings.workers // 2)}
        self._accounts: dict[str, str] = {}  # project id -> its account's (they never change)
        self._starts = StartPacing(
            per_minute=settings.compute_starts_per_minute, burst=settings.compute_starts_burst
        )
        self._timer: asyncio.TimerHandle | None = None  # a look when a paced start may go
        # Operation id -> (event set when it settles here, number of waiters).
        self._watched: dict[str, tuple[asyncio.Event, int]] = {}

    def wake(self) -> None:
        """Look for work now (called after a request wrote new operations)."""
        self._wake.set()

    async def wait_settled(
        self, *, project_id: str, operation_id: str, time_limit: float
    ) -> Operation | None:
        """The operation once finished or failed (None if it vanished); TimeoutError past the limit.

        Woken at once when this process settles it; a short poll of the store covers an operation
        another process (another replica) runs.
        """
        event, waiters = self._watched.get(operation_id, (asyncio.Event(), 0))
        self._watched[operation_id] = (event, waiters + 1)
        try:
            async with asyncio.timeout(time_limit):
                while True:
                    async with self._store.read() as tx:
                        op = await tx.get_operation(
                            project_id=project_id, operation_id=operation_id
                        )
                    if op is None or op.status.settled:
                        return op
                    await aio.wait_event(event, 0.25)
        finally:
            event, waiters = self._watched[operation_id]
            if waiters > 1:
                self._watched[operation_id] = (event, waiters - 1)
            else:
                del self._watched[operation_id]

    def _settled(self, operation_id: str) -> None:
        watched = self._watched.get(operation_id)
        if watched is not None:
            watched[0].set()

    async def run(self) -> None:
        """Dispatch until cancelled; in-flight attempts are cancelled with it (leases expire)."""
        log.info(
            "operations engine started (%d workers, owner %s)", self._settings.workers, self.owner
        )
        # Other processes' new operations wake this one at once where the store announces them.
        watcher = asyncio.create_task(self._store.watch_operations(self.wake), name="watcher")
        try:
            while True:
                try:
                    await self._dispatch_once()
                except Unavailable as exc:  # the store's outage, said once per look, no trace
                    log.warning("operations dispatcher waits for the store: %s", exc.message)
                except Exception:
                    log.exception("operations dispatcher failed; continuing")
                await aio.wait_event(self._wake, self._settings.poll_seconds)
                self._wake.clear()
        finally:
            watcher.cancel()
            if self._timer is not None:
                self._timer.cancel()
            for task in list(self._running.values()):
                task.cancel()
            await asyncio.gather(watcher, *self._running.values(), return_exceptions=True)

    async def _dispatch_once(self) -> None:
        async with self._store.read() as tx:
            unsettled = await tx.list_unsettled_operations(node=self.node)
        now = clock.now_us()
        for op in claimable(unsettled, now):
            if op.id in self._running:
                continue
            long = op.action in LONG_ACTIONS
            if long and op.project_id in self._long_projects:
                continue  # the project's next copy waits for its current one
            slots = self._long_slots if long else self._slots
            if slots.locked():
                continue  # the other kind may still have room
            account = await self._account_of(op.project_id)
            if self._held[account, long] >= self._caps[long]:
                continue  # the account's share is taken: others' work goes first
            start = op.action == Action.START_COMPUTE
            if start and (wait := self._starts.wait(account)) > 0:
                self._look_in(wait)
                continue  # past the account's burst of starts: its turn comes
            async with self._store.write() as tx:
                claimed = await tx.claim_operation(
                    seen=op,
                    owner=self.owner,
                    now=now,
                    lease_until=now + int(self._settings.lease_seconds * _US),
                    # An expired lease held by a worker means that worker died mid-attempt.
                    failed_attempt=op.status is Status.RUNNING and op.lease_owner is not None,
                    node=self.node,
                )
            if claimed is None:
                continue
            if start:
                self._starts.take(account)
            await slots.acquire()
            self._held[account, long] += 1
            if long:
                self._long_projects.add(claimed.project_id)
            task = asyncio.create_task(
                self._attempt(claimed, slots, (account, long)), name=f"operation {claimed.id}"
            )
            self._running[claimed.id] = task

    def _look_in(self, seconds: float) -> None:
        """Look for work again in ``seconds`` (and at every wake and poll meanwhile)."""
        loop = asyncio.get_running_loop()
        now, timer = loop.time(), self._timer
        if timer is not None and now < timer.when() <= now + seconds:
            return  # a look no later is due anyway
        if timer is not None:
            timer.cancel()
        self._timer = loop.call_at(now + seconds, self._wake.set)

    async def _account_of(self, project_id: str) -> str:
        found = self._accounts.get(project_id)
        if found is None:
            async with self._store.read() as tx:
                project = await tx.get_project_by_id(project_id)
            found = "" if project is None else project.account_id  # gone: a share of its own
            if len(self._accounts) > _ACCOUNTS_KEPT:
                self._accounts.clear()
            self._accounts[project_id] = found
        return found

    async def _attempt(
        self, op: Operation, slots: asyncio.Semaphore, share: tuple[str, bool]
    ) -> None:
        long = share[1]
        # The attempt's own task: its log lines name the operation, and no other task's do.
        logs.in_operation(
            op.id, project=op.project_id, branch=op.branch_id, endpoint=op.endpoint_id
        )
        heartbeat = asyncio.create_task(self._heartbeat(op))
        try:
            await self._run_handler(op)
        finally:
            heartbeat.cancel()
            self._running.pop(op.id, None)
            if long:
                self._long_projects.discard(op.project_id)
            self._held[share] -= 1
            slots.release()
            self._wake.set()  # what waited behind this operation may run now

    async def _run_handler(self, op: Operation) -> None:
        started = op.attempt_started_at or clock.now_us()
        log.info(
            "operation %s %s (%s) attempt %d",
            op.id,
            op.action,
            op.project_id,
            op.failures_count + 1,
        )
        limit = self._settings.attempt_timeout_seconds
        timer = asyncio.timeout(limit if limit > 0 else None)
        try:
            async with timer:
                await failpoints.reached(f"before:{op.action}")
                on_finish = await self._handler_for(op)(self._context, op)
                await failpoints.reached(f"after:{op.action}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if isinstance(exc, TimeoutError) and timer.expired():
                # Cancelled, not merely abandoned: handlers clean up on cancellation (a half
                # started postmaster is stopped, a copy thread is told to stop and waited for),
                # so the retry does not race what this attempt left running.
                exc = AttemptTimedOut(f"{op.action} timed out after {limit:g} s")
            await self._record_failure(op, started, exc)
            return
        now = clock.now_us()
        done = msgspec.structs.replace(
            op,
            status=Status.FINISHED,
            error=None,
            retry_at=None,
            updated_at=now,
            total_duration_ms=_took_ms(op, started, now),
            lease_owner=None,
            lease_expires_at=None,
            attempt_started_at=None,
        )
        check_transition(op.status, done.status)

        async def finish(tx: Tx) -> None:
            if await tx.update_owned_operation(done, owner=self.owner) and on_finish is not None:
                await on_finish(tx)

        await self._record(op, finish)
        self._settled(op.id)
        self._metrics.operation_settled(op.action, "finished", done.total_duration_ms / 1000)
        log.info("operation %s %s finished in %d ms", op.id, op.action, (now - started) // 1000)

    def _handler_for(self, op: Operation) -> Handler:
        handler = self._handlers.get(op.action)
        if handler is None:
            raise PermanentError(f"no handler for action {op.action}")
        if op.failures_count >= self._policy.max_attempts:
            # A worker died during the last allowed attempt: give up rather than loop forever.
            raise PermanentError(op.error or "too many failed attempts")
        return handler

    async def _record_failure(self, op: Operation, started: int, exc: Exception) -> None:
        if isinstance(exc, ComputeError | PgplaneError | PermanentError | AttemptTimedOut):
            reason = str(exc)
            log.warning("operation %s %s failed: %s", op.id, op.action, reason)
        else:
            reason = f"internal error: {type(exc).__name__}: {exc}"
            log.exception("operation %s %s failed unexpectedly", op.id, op.action)
        now = clock.now_us()
        failures = op.failures_count + 1
        permanent = isinstance(exc, PermanentError) or (
            isinstance(exc, ComputeError) and exc.permanent
        )
        final = permanent or self._policy.exhausted(failures)
        retry_at = None if final else now + int(self._policy.backoff_seconds(failures) * _US)
        failed = msgspec.structs.replace(
            op,
            status=Status.FAILED if final else Status.SCHEDULING,
            failures_count=failures,
            error=scrub(reason),  # the tenant's to read: no machine path
            retry_at=retry_at,
            updated_at=now,
            total_duration_ms=_took_ms(op, started, now),
            lease_owner=None,
            lease_expires_at=None,
            attempt_started_at=None,
        )
        check_transition(op.status, failed.status)

        async def fail(tx: Tx) -> None:
            if await tx.update_owned_operation(failed, owner=self.owner) and final:
                given_up = GIVEN_UP.get(op.action)
                if given_up is not None:
                    await given_up(tx, failed)

        await self._record(op, fail)
        if final:
            self._settled(op.id)
            self._metrics.operation_settled(op.action, "failed", failed.total_duration_ms / 1000)
        else:
            self._metrics.operation_retried(op.action)

    async def _record(self, op: Operation, write: Callable[[Tx], Awaitable[None]]) -> None:
        """Write an attempt's outcome, waiting out a store outage (a full disk, an I/O error).

        The attempt's work is done: given up, the outcome would be lost with the lease, and the
        next attempt would do the work again and count this one as failed. Kept trying, the
        attempt that did the work is the one recorded, once the store takes writes again.
        """
        pause, said = 0.05, False
        while True:
            try:
                async with self._store.write() as tx:
                    await write(tx)
            except Unavailable as exc:
                if not said:
                    log.warning("operation %s: outcome not recorded yet: %s", op.id, exc.message)
                    said = True
                await asyncio.sleep(pause)
                pause = min(pause * 2, _RECORD_PAUSE_CAP)
            else:
                return

    async def _heartbeat(self, op: Operation) -> None:
        """Extend the lease while the handler runs, so a slow attempt is not taken for dead."""
        current = op
        while True:
            await asyncio.sleep(self._settings.heartbeat_seconds)
            now = clock.now_us()
            renewed = msgspec.structs.replace(
                current,
                lease_expires_at=now + int(self._settings.lease_seconds * _US),
            )
            try:
                async with self._store.write() as tx:
                    if not await tx.update_owned_operation(renewed, owner=self.owner):
                        log.warning("operation %s: lease lost", op.id)
                        return
            except Unavailable as exc:
                # Beat again next time: an outage of the store must not end the heartbeat for
                # good, or the lease would lapse while the attempt goes on after the outage.
                log.warning("operation %s: lease not renewed: %s", op.id, exc.message)
                continue
            current = renewed
