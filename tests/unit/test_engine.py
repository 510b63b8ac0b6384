"""The operations engine against the real SQLite store, with handlers written for the test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import msgspec
import pytest

from pgplane.compute.driver import ComputeDriver, ComputeError
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.core.operations import Action, Status
from pgplane.engine import Engine
from pgplane.engine.context import Context, OnFinish
from pgplane.services import accounts, endpoints, operations, projects
from pgplane.store.sqlite import SqliteStore
from tests.support import no_pg_settings

FAST = {
    "poll_seconds": 0.02,
    "lease_seconds": 0.5,
    "heartbeat_seconds": 0.1,
    "retry_base_seconds": 0.01,
    "retry_cap_seconds": 0.05,
    "max_attempts": 3,
    "pg_versions": (16,),
}

Handler = Callable[[Context, Operation], Awaitable[OnFinish | None]]


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "store.db")
    yield s
    await s.close()


@contextlib.asynccontextmanager
async def engine(
    store: SqliteStore, handlers: dict[Action, Handler], **settings: Any
) -> AsyncIterator[Engine]:
    eng = Engine(
        store=store,
        driver=cast(ComputeDriver, object()),
        settings=Settings(**{**FAST, **settings}),
        handlers=handlers,
    )
    task = asyncio.create_task(eng.run())
    try:
        yield eng
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _project(store: SqliteStore, email: str = "e@example.com") -> str:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email=email)
        created = await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(**FAST),
            check_settings=no_pg_settings,
        )
    return created.project.id


async def _start(store: SqliteStore, project_id: str, *starts: operations.Start) -> list[str]:
    async with store.write() as tx:
        ops = await operations.start(tx, project_id=project_id, starts=starts)
    return [o.id for o in ops]


async def _settled(store: SqliteStore, project_id: str, timeout: float = 10) -> list[Operation]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        async with store.read() as tx:
            ops = await tx.list_operations(project_id=project_id, before=None, limit=1000)
        if all(o.status.settled for o in ops):
            return list(reversed(ops))
        assert asyncio.get_running_loop().time() < deadline, ops
        await asyncio.sleep(0.02)


async def _noop(ctx: Context, op: Operation) -> OnFinish | None:
    return None


ALL_NOOP: dict[Action, Handler] = dict.fromkeys(Action, _noop)


async def test_operations_finish_and_record_their_duration(store: SqliteStore) -> None:
    pid = await _project(store)
    async with engine(store, ALL_NOOP):
        ops = await _settled(store, pid)
    assert [o.status for o in ops] == [Status.FINISHED, Status.FINISHED]
    assert all(o.lease_owner is None and o.error is None for o in ops)


async def test_on_finish_is_written_with_the_finish(store: SqliteStore) -> None:
    pid = await _project(store)

    async def ready(ctx: Context, op: Operation) -> OnFinish | None:
        async def mark(tx: Any) -> None:
            assert op.branch_id is not None
            await tx.set_branch_state(
                branch_id=op.branch_id,
                current_state="ready",
                pending_state=None,
                now=clock.now_us(),
            )

        return mark

    async with engine(store, {**ALL_NOOP, Action.CREATE_TIMELINE: ready}):
        ops = await _settled(store, pid)
    async with store.read() as tx:
        (branch,) = await tx.list_branches(pid)
    assert branch.current_state == "ready"
    assert ops[0].status is Status.FINISHED


async def test_failures_are_retried_then_fail_with_the_reason(store: SqliteStore) -> None:
    pid = await _project(store)
    attempts: list[int] = []

    async def broken(ctx: Context, op: Operation) -> OnFinish | None:
        attempts.append(op.failures_count)
        raise ComputeError("disk on fire")

    async with engine(store, {**ALL_NOOP, Action.CREATE_TIMELINE: broken}):
        ops = await _settled(store, pid)
    timeline, compute = ops
    assert attempts == [0, 1, 2]
    assert timeline.status is Status.FAILED
    assert timeline.failures_count == 3
    assert timeline.error == "disk on fire"
    assert timeline.retry_at is None
    # The compute's start waited for the timeline, then ran (and here succeeded).
    assert compute.status is Status.FINISHED


async def test_a_flaky_handler_succeeds_on_retry(store: SqliteStore) -> None:
    pid = await _project(store)
    calls = 0

    async def flaky(ctx: Context, op: Operation) -> OnFinish | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("transient")
        return None

    async with engine(store, {**ALL_NOOP, Action.CREATE_TIMELINE: flaky}):
        ops = await _settled(store, pid)
    assert ops[0].status is Status.FINISHED
    assert ops[0].failures_count == 1
    assert ops[0].error is None


async def test_a_dead_workers_operation_is_taken_over_when_its_lease_expires(
    store: SqliteStore,
) -> None:
    pid = await _project(store)
    # A worker claims the first operation, then dies (never finishes, never renews).
    async with store.read() as tx:
        first = (await tx.list_unsettled_operations(pid))[0]
    now = clock.now_us()
    async with store.write() as tx:
        claimed = await tx.claim_operation(
            seen=first,
            owner="dead-worker",
            now=now,
            lease_until=now + 200_000,
            failed_attempt=False,
        )
    assert claimed is not None and claimed.status is Status.RUNNING
    async with engine(store, ALL_NOOP):
        ops = await _settled(store, pid)
    assert [o.status for o in ops] == [Status.FINISHED, Status.FINISHED]
    assert ops[0].failures_count == 1  # the abandoned attempt counts
    # ... and so does its time: the operation took from the dead worker's start to its end, the
    # lease it held included, not just the attempt that finished it.
    assert ops[0].total_duration_ms >= 200


async def test_claims_are_compare_and_set(store: SqliteStore) -> None:
    pid = await _project(store)
    async with store.read() as tx:
        first = (await tx.list_unsettled_operations(pid))[0]
    now = clock.now_us()
    async with store.write() as tx:
        a = await tx.claim_operation(
            seen=first, owner="a", now=now, lease_until=now + 10**7, failed_attempt=False
        )
        b = await tx.claim_operation(
            seen=first, owner="b", now=now, lease_until=now + 10**7, failed_attempt=False
        )
    assert a is not None and b is None
    stolen = msgspec.structs.replace(a, status=Status.FINISHED)
    async with store.write() as tx:
        assert not await tx.update_owned_operation(stolen, owner="b")
        assert await tx.update_owned_operation(stolen, owner="a")


async def test_same_branch_in_order_other_branches_in_parallel(store: SqliteStore) -> None:
    pid = await _project(store)
    events: list[str] = []
    gate = asyncio.Event()

    async def slow(ctx: Context, op: Operation) -> OnFinish | None:
        events.append(f"start {op.branch_id}:{op.action}")
        if op.branch_id == "b1":
            await gate.wait()
        events.append(f"end {op.branch_id}:{op.action}")
        return None

    await _settled_with(store, pid)
    await _start(
        store,
        pid,
        operations.Start(Action.APPLY_CONFIG, branch_id="b1"),
        operations.Start(Action.SUSPEND_COMPUTE, branch_id="b1"),
        operations.Start(Action.APPLY_CONFIG, branch_id="b2"),
    )
    async with engine(store, dict.fromkeys(Action, slow)):
        while "end b2:apply_config" not in events:
            await asyncio.sleep(0.01)
        # b2 finished while b1's first operation still runs, and b1's second has not started.
        assert "start b1:suspend_compute" not in events
        gate.set()
        await _settled(store, pid)
    b1 = [e for e in events if "b1" in e]
    assert b1 == [
        "start b1:apply_config",
        "end b1:apply_config",
        "start b1:suspend_compute",
        "end b1:suspend_compute",
    ]


async def test_long_actions_run_one_per_project_and_never_hold_up_short_ones(
    store: SqliteStore,
) -> None:
    """Two copy slots: project A's first copy and B's take them; A's second copy waits for
    A's first (though its branches differ), and B's short work runs meanwhile."""
    a, b = await _project(store), await _project(store, "b@example.com")
    events: list[str] = []
    gate = asyncio.Event()

    async def handler(ctx: Context, op: Operation) -> OnFinish | None:
        events.append(f"start {op.branch_id}")
        if op.action is Action.CREATE_BRANCH:
            await gate.wait()
        events.append(f"end {op.branch_id}")
        return None

    await _settled_with(store, a)
    await _settled_with(store, b)
    await _start(store, a, operations.Start(Action.CREATE_BRANCH, branch_id="a1"))
    await _start(store, a, operations.Start(Action.CREATE_BRANCH, branch_id="a2"))
    await _start(store, b, operations.Start(Action.CREATE_BRANCH, branch_id="b1"))
    await _start(store, b, operations.Start(Action.START_COMPUTE, branch_id="b2"))
    await _start(store, b, operations.Start(Action.APPLY_CONFIG, branch_id="b3"))
    async with engine(store, dict.fromkeys(Action, handler), workers=2):
        while not {"start a1", "start b1", "end b2", "end b3"} <= set(events):
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # many dispatcher turns
        assert "start a2" not in events
        gate.set()
        await _settled(store, a)
        await _settled(store, b)
    assert events.index("start a2") > events.index("end a1")


async def test_an_account_never_holds_every_slot_of_a_kind(store: SqliteStore) -> None:
    """Four slots of each kind: an account whose work hangs (builds its own SQL makes slow,
    suspends of postmasters it stopped) holds two long slots and three short ones at most; the
    other account's copy and wake run at once beside them."""
    mine = [await _project(store) for _ in range(4)]
    other = await _project(store, "other@example.com")
    for pid in [*mine, other]:
        await _settled_with(store, pid)
    events: list[str] = []
    gate = asyncio.Event()

    async def handler(ctx: Context, op: Operation) -> OnFinish | None:
        events.append(f"start {op.branch_id}")
        if op.project_id != other:
            await gate.wait()
        events.append(f"end {op.branch_id}")
        return None

    for i, pid in enumerate(mine):
        await _start(store, pid, operations.Start(Action.CREATE_BRANCH, branch_id=f"copy{i}"))
        await _start(store, pid, operations.Start(Action.SUSPEND_COMPUTE, branch_id=f"stop{i}"))
    async with engine(store, dict.fromkeys(Action, handler), workers=4):
        while sum(e.startswith("start copy") for e in events) < 2:
            await asyncio.sleep(0.01)
        while sum(e.startswith("start stop") for e in events) < 3:
            await asyncio.sleep(0.01)
        await _start(store, other, operations.Start(Action.CREATE_BRANCH, branch_id="theirs"))
        await _start(store, other, operations.Start(Action.START_COMPUTE, branch_id="wake"))
        await _settled(store, other)  # beside the hung ones
        assert sum(e.startswith("start copy") for e in events) == 2
        assert sum(e.startswith("start stop") for e in events) == 3
        gate.set()
        for pid in mine:
            await _settled(store, pid)
    assert {"end theirs", "end wake"} <= set(events)


async def test_an_accounts_starts_past_its_burst_wait_their_turn_and_others_do_not(
    store: SqliteStore,
) -> None:
    """Starts are paced per account (engine/pacing.py): past its burst of two, an account's
    third waits (one a minute here, so it never comes in the test); another account's start
    runs at once beside it."""
    mine = [await _project(store) for _ in range(3)]
    other = await _project(store, "other@example.com")
    for pid in [*mine, other]:
        await _settled_with(store, pid)
    started: list[str] = []

    async def handler(ctx: Context, op: Operation) -> OnFinish | None:
        started.append(op.project_id)
        return None

    for pid in mine:
        await _start(store, pid, operations.Start(Action.START_COMPUTE, branch_id="wake"))
    pacing = {"compute_starts_per_minute": 1, "compute_starts_burst": 2}
    async with engine(store, dict.fromkeys(Action, handler), **pacing):
        while len(started) < 2:
            await asyncio.sleep(0.01)
        await _start(store, other, operations.Start(Action.START_COMPUTE, branch_id="wake"))
        await _settled(store, other)
        assert other in started
        [waiting] = [p for p in mine if p not in started]
        async with store.read() as tx:
            ops = await tx.list_operations(project_id=waiting, before=None, limit=10)
        newest = next(o for o in ops if o.action == Action.START_COMPUTE)
        assert not newest.status.settled and newest.started_at is None  # never claimed


async def test_a_paced_start_runs_when_its_turn_comes_without_waiting_for_a_poll(
    store: SqliteStore,
) -> None:
    """One start at once, then ten a second: the second runs about 0.1 s later, looked for
    then (the engine's poll is 30 s here)."""
    mine = [await _project(store) for _ in range(2)]
    for pid in mine:
        await _settled_with(store, pid)
        await _start(store, pid, operations.Start(Action.START_COMPUTE, branch_id="wake"))
    pacing = {"compute_starts_per_minute": 600, "compute_starts_burst": 1, "poll_seconds": 30}
    async with engine(store, ALL_NOOP, **pacing):
        for pid in mine:
            await _settled(store, pid, timeout=10)


async def _settled_with(store: SqliteStore, pid: str) -> None:
    """Settle the project's creation operations first, so only the test's own remain."""
    async with engine(store, ALL_NOOP):
        await _settled(store, pid)


async def test_unknown_action_fails_at_once(store: SqliteStore) -> None:
    pid = await _project(store)
    await _settled_with(store, pid)
    (op_id,) = await _start(store, pid, operations.Start(Action.TENANT_ATTACH))
    async with engine(store, {}):
        ops = await _settled(store, pid)
    op = next(o for o in ops if o.id == op_id)
    assert op.status is Status.FAILED
    assert op.failures_count == 1
    assert op.error == "no handler for action tenant_attach"


@pytest.mark.parametrize(
    ("asked_since", "pending_after"), [(None, None), ("active", "active")], ids=["alone", "start"]
)
async def test_a_suspend_that_fails_for_good_leaves_the_endpoint_as_it_was(
    store: SqliteStore, asked_since: str | None, pending_after: str | None
) -> None:
    # Left pending "idle", the scheduler would never try to suspend the compute again.
    pid = await _project(store)
    await _settled_with(store, pid)
    async with store.write() as tx:
        (endpoint,) = await tx.list_endpoints(pid)
        await tx.set_endpoint_state(
            endpoint_id=endpoint.id, current_state="active", pending_state=None, now=clock.now_us()
        )
        account = await accounts.ensure(tx, email="e@example.com")
        _, (suspend,) = await endpoints.suspend(
            tx, account_id=account.id, project_id=pid, endpoint_id=endpoint.id
        )
    if asked_since is not None:  # a start asked for after the suspend: its own to settle
        async with store.write() as tx:
            current = await tx.get_endpoint(project_id=pid, endpoint_id=endpoint.id)
            assert current is not None and current.pending_state == "idle"
            await tx.update_endpoint(msgspec.structs.replace(current, pending_state=asked_since))

    async def cannot_stop(ctx: Context, op: Operation) -> OnFinish | None:
        raise ComputeError("the postmaster would not stop")

    async with engine(store, {**ALL_NOOP, Action.SUSPEND_COMPUTE: cannot_stop}):
        ops = await _settled(store, pid)
    (failed,) = [o for o in ops if o.id == suspend.id]
    assert (failed.status, failed.failures_count) == (Status.FAILED, 3)
    async with store.read() as tx:
        after = await tx.get_endpoint(project_id=pid, endpoint_id=endpoint.id)
    assert after is not None
    assert (after.current_state, after.pending_state) == ("active", pending_after)


async def test_a_hung_attempt_is_cancelled_at_its_time_limit_and_retried(
    store: SqliteStore,
) -> None:
    pid = await _project(store)
    cancelled: list[int] = []

    async def hangs_once(ctx: Context, op: Operation) -> OnFinish | None:
        if op.failures_count == 0:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.append(op.failures_count)
                raise
        return None

    async def hangs(ctx: Context, op: Operation) -> OnFinish | None:
        await asyncio.Event().wait()
        return None

    # The lease is renewed all along (the worker is alive): only the time limit ends them.
    handlers = {**ALL_NOOP, Action.CREATE_TIMELINE: hangs_once, Action.START_COMPUTE: hangs}
    async with engine(store, handlers, attempt_timeout_seconds=0.2):
        timeline, compute = await _settled(store, pid)
    assert cancelled == [0]  # the hung attempt was cancelled, not left running beside the retry
    assert timeline.status is Status.FINISHED
    assert timeline.failures_count == 1
    assert compute.status is Status.FAILED
    assert compute.failures_count == 3
    assert compute.error == "start_compute timed out after 0.2 s"


@pytest.mark.parametrize("turns", range(6))
async def test_the_engine_stops_when_cancelled_in_the_turn_it_is_woken(
    store: SqliteStore, turns: int
) -> None:
    # The dispatcher once waited for its wake-up with 3.11's wait_for, which dropped a
    # cancellation arriving with the wake-up: the loop ran on and shutdown hung (seen in CI).
    eng = Engine(
        store=store, driver=cast(ComputeDriver, object()), settings=Settings(**FAST), handlers={}
    )
    task = asyncio.create_task(eng.run())
    await asyncio.sleep(0.05)  # idle, waiting to be woken
    eng.wake()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)  # a guard against a hang, not a timing
    assert done and task.cancelled()
