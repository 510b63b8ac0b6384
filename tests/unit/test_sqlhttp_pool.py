"""SQL over HTTP's connection pool: its bounds, reuse (reset ahead of the next request, or where
it lies once idle a while, verified), and dropping what a compute closed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pgplane.errors import SqlFailed
from pgplane.proxy.seam import Target
from pgplane.proxy.sqlhttp.pool import Conn, Key, Pool

A: Key = ("ep-a-1", "alice", "db", ())
B: Key = ("ep-b-1", "bob", "db", ())
TARGET = Target("ep-a-1", "127.0.0.1", 1)


class FakeSide:
    """What the pool uses of a compute connection: ``lost``, ``unread`` and ``close``."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.pending = 0
        self.resets = 0

    def unread(self) -> int:
        return self.pending

    def close(self) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)


class Resets:
    """A reset that succeeds at once, or as the test says (``hold``: until ``answer``)."""

    def __init__(self) -> None:
        self.hold = False
        self.waiting: list[asyncio.Future[bool]] = []
        self.begun = asyncio.Event()  # a reset was started

    async def __call__(self, side: Any) -> bool:
        side.resets += 1
        self.begun.set()
        if not self.hold:
            return True
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append(answer)
        return await answer

    def answer(self, clean: bool) -> None:
        self.waiting.pop(0).set_result(clean)


def _pool(**bounds: Any) -> tuple[Pool, Resets]:
    """A pool whose idle connections are reset where they lie only when a test says so
    (``settle_seconds=0``: as soon as the loop turns)."""
    resets = Resets()
    return Pool(reset=resets, **{"settle_seconds": 3600.0, **bounds}), resets


async def _open(pool: Pool, key: Key) -> tuple[Conn, Any]:
    assert await pool.acquire(key, wait=0) is None  # a slot: open one
    side = FakeSide()
    return pool.adopt(key, side, TARGET, None), side  # type: ignore[arg-type]


async def test_a_connection_is_idle_at_once_and_reset_ahead_of_its_next_request() -> None:
    pool, resets = _pool(per_key=2, total=10)
    conn, side = await _open(pool, A)
    assert not conn.dirty  # a new session: nothing to reset
    pool.release(conn, reusable=True)
    assert pool.counts(A) == (1, 1) and conn.dirty
    again = await pool.acquire(A, wait=0)
    assert again is conn and conn.dirty  # the request it goes to resets it first
    pool.release(conn, reusable=False)  # left in a transaction, say: not even reset
    assert side.closed and side.resets == 0 and pool.counts(A) == (0, 0)
    assert not resets.begun.is_set()


async def test_a_connection_left_idle_is_reset_where_it_lies() -> None:
    pool, resets = _pool(per_key=2, total=10, settle_seconds=0)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    await resets.begun.wait()
    await pool.settled()
    assert side.resets == 1 and pool.counts(A) == (1, 1)
    assert await pool.acquire(A, wait=0) is conn and not conn.dirty  # clean: no reset ahead
    pool.close()


async def test_a_failed_reset_closes_the_connection_and_frees_its_slot() -> None:
    pool, resets = _pool(per_key=1, total=10, settle_seconds=0)
    resets.hold = True
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    await resets.begun.wait()
    waiting = asyncio.create_task(pool.acquire(A, wait=5))
    await asyncio.sleep(0)
    assert not waiting.done()  # it waits for the one being reset
    resets.answer(False)
    assert await waiting is None  # that one was closed: a slot to open a new one in
    assert side.closed and pool.counts(A) == (1, 0)


async def test_a_request_waits_for_a_connection_being_reset_rather_than_open_one() -> None:
    pool, resets = _pool(per_key=5, total=10, settle_seconds=0)
    resets.hold = True
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    await resets.begun.wait()
    first = asyncio.create_task(pool.acquire(A, wait=5))
    await asyncio.sleep(0)
    assert not first.done()
    # One reset under way is claimed by one request: another opens a connection of its own,
    # and a retry after a stale connection never waits for a pooled one.
    assert await pool.acquire(A, wait=5) is None
    assert await pool.acquire(A, wait=5, fresh=True) is None
    resets.answer(True)
    assert await first is conn and not side.closed and not conn.dirty


async def test_a_connection_its_compute_closed_leaves_the_pool_at_once() -> None:
    pool, _ = _pool()
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    side.lost.set_result(None)  # the compute suspended: its sessions ended
    await asyncio.sleep(0)
    assert pool.counts(A) == (0, 0)
    assert await pool.acquire(A, wait=0) is None  # a new one is opened


async def test_an_idle_connection_that_spoke_is_not_handed_out() -> None:
    pool, _ = _pool()
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    side.pending = 90  # a shutdown's FATAL, say, its close not seen yet
    assert await pool.acquire(A, wait=0) is None
    assert side.closed and pool.counts(A) == (1, 0)


async def test_past_the_bounds_a_request_waits_then_is_refused() -> None:
    pool, _ = _pool(per_key=1, total=10)
    conn, _ = await _open(pool, A)
    waiting = asyncio.create_task(pool.acquire(A, wait=5))
    await asyncio.sleep(0)
    assert not waiting.done()
    pool.release(conn, reusable=True)
    assert await waiting is conn  # handed over when given back, to be reset ahead
    with pytest.raises(SqlFailed, match="too many SQL over HTTP requests") as refused:
        await pool.acquire(A, wait=0.01)
    assert refused.value.fields["code"] == "53300"


async def test_an_idle_connection_of_another_key_makes_room() -> None:
    pool, _ = _pool(per_key=5, total=1)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    assert await pool.acquire(B, wait=0) is None  # A's idle one was closed for it
    assert side.closed and pool.counts(A) == (0, 0) and pool.counts(B) == (1, 0)
    pool.forfeit(B)
    assert pool.counts(B) == (0, 0)


async def test_idle_connections_age_out_and_fresh_skips_the_idle() -> None:
    pool, _ = _pool(idle_seconds=0)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    assert await pool.acquire(A, wait=0, fresh=True) is None
    assert side.closed  # aged out when the pool was next used
    pool.close()


async def test_closing_the_pool_closes_connections_being_reset() -> None:
    pool, resets = _pool(settle_seconds=0)
    resets.hold = True
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    await resets.begun.wait()
    pool.close()
    assert side.closed and pool.counts(A) == (0, 0)
    await pool.settled()


async def test_only_connections_idle_long_enough_are_reset_where_they_lie() -> None:
    pool, resets = _pool(per_key=2, total=10, settle_seconds=0.05)
    older, older_side = await _open(pool, A)
    newer, newer_side = await _open(pool, A)
    pool.release(older, reusable=True)
    await resets.begun.wait()
    await pool.settled()
    assert (older_side.resets, newer_side.resets) == (1, 0)  # the busy one is left alone
    resets.begun.clear()
    pool.release(newer, reusable=True)
    await resets.begun.wait()  # looked at again once the newer one has settled too
    await pool.settled()
    assert (older_side.resets, newer_side.resets) == (1, 1)
    assert not older.dirty and not newer.dirty and pool.counts(A) == (2, 2)
    pool.close()


async def test_an_account_holds_its_share_and_another_account_is_served_beside_it() -> None:
    """One account's requests over many keys hold its share of the pool at most (here 4 of
    8): the rest is another account's at once, and past its share the first account's next
    request waits for one of its own, or closes an idle one of its own for it."""
    pool, _ = _pool(per_key=2, total=8, per_account=4)
    keys: list[Key] = [(f"ep-{i}", "r", "d", ()) for i in range(5)]
    greedy = []
    for key in keys[:2]:
        for _ in range(2):
            assert await pool.acquire(key, wait=0, account="greedy") is None
            greedy.append(pool.adopt(key, FakeSide(), TARGET, None))  # type: ignore[arg-type]
    with pytest.raises(SqlFailed, match="too many SQL over HTTP requests"):
        await pool.acquire(keys[2], wait=0.01, account="greedy")
    for key in keys[3:]:  # another account: the rest of the pool, at once
        for _ in range(2):
            assert await pool.acquire(key, wait=0, account="other") is None
    pool.release(greedy[0], reusable=True)  # greedy's idle one makes room for its other key
    assert await pool.acquire(keys[2], wait=0, account="greedy") is None
    assert pool.counts(keys[0]) == (1, 0)


async def test_a_connection_given_back_wakes_one_waiter_of_its_key_not_all() -> None:
    """Requests waiting on a key at its cap are woken one per connection given back, first
    come first: woken all at once, 54 of them ran for each of ten connections ending together,
    a burst of the event loop's time every other account's requests waited behind."""
    pool, _ = _pool(per_key=1, total=10)
    conn, _ = await _open(pool, A)
    waiting = [asyncio.create_task(pool.acquire(A, wait=30)) for _ in range(20)]
    await asyncio.sleep(0)
    polls = 0
    expire = pool._expire  # each turn of a waiter's loop looks for expired idle ones first

    def count(now: float) -> None:
        nonlocal polls
        polls += 1
        expire(now)

    pool._expire = count  # type: ignore[method-assign]
    pool.release(conn, reusable=True)
    await asyncio.sleep(0.01)
    served = [t for t in waiting if t.done()]
    assert [t.result() for t in served] == [conn]
    assert served[0] is waiting[0]  # the first to come
    assert polls == 1, polls  # the one woken, not twenty
    pool.release(conn, reusable=True)
    await asyncio.sleep(0.01)
    assert waiting[1].done() and sum(t.done() for t in waiting) == 2
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_a_waiter_woken_that_leaves_passes_its_turn_on() -> None:
    pool, _ = _pool(per_key=1, total=10)
    conn, _ = await _open(pool, A)
    first = asyncio.create_task(pool.acquire(A, wait=30))
    second = asyncio.create_task(pool.acquire(A, wait=30))
    await asyncio.sleep(0)
    pool.release(conn, reusable=True)  # wakes the first...
    first.cancel()  # ...whose client is gone before it runs
    await asyncio.gather(first, return_exceptions=True)
    assert await asyncio.wait_for(second, 5) is conn  # the second is served, not left waiting
