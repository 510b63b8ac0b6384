"""SQL over HTTP's connection pool: its bounds, reuse, and dropping what a compute closed."""

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
    """What the pool uses of a compute connection: ``lost`` and ``close``."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False

    def close(self) -> None:
        self.closed = True
        if not self.lost.done():
            self.lost.set_result(None)


async def _open(pool: Pool, key: Key) -> tuple[Conn, Any]:
    assert await pool.acquire(key, wait=0) is None  # a slot: open one
    side = FakeSide()
    return pool.adopt(key, side, TARGET, None), side  # type: ignore[arg-type]


async def test_an_idle_connection_is_reused_and_one_in_doubt_is_not() -> None:
    pool = Pool(per_key=2, total=10)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    assert pool.counts(A) == (1, 1)
    again = await pool.acquire(A, wait=0)
    assert again is conn and conn.used
    pool.release(conn, reusable=False)  # left in a transaction, say
    assert side.closed and pool.counts(A) == (0, 0)


async def test_a_connection_its_compute_closed_leaves_the_pool_at_once() -> None:
    pool = Pool()
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    side.lost.set_result(None)  # the compute suspended: its sessions ended
    await asyncio.sleep(0)
    assert pool.counts(A) == (0, 0)
    assert await pool.acquire(A, wait=0) is None  # a new one is opened


async def test_past_the_bounds_a_request_waits_then_is_refused() -> None:
    pool = Pool(per_key=1, total=10)
    conn, _ = await _open(pool, A)
    waiting = asyncio.create_task(pool.acquire(A, wait=5))
    await asyncio.sleep(0)
    assert not waiting.done()
    pool.release(conn, reusable=True)
    assert await waiting is conn  # handed over when given back
    with pytest.raises(SqlFailed, match="too many SQL over HTTP requests") as refused:
        await pool.acquire(A, wait=0.01)
    assert refused.value.fields["code"] == "53300"


async def test_an_idle_connection_of_another_key_makes_room() -> None:
    pool = Pool(per_key=5, total=1)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    assert await pool.acquire(B, wait=0) is None  # A's idle one was closed for it
    assert side.closed and pool.counts(A) == (0, 0) and pool.counts(B) == (1, 0)
    pool.forfeit(B)
    assert pool.counts(B) == (0, 0)


async def test_idle_connections_age_out_and_fresh_skips_the_idle() -> None:
    pool = Pool(idle_seconds=0)
    conn, side = await _open(pool, A)
    pool.release(conn, reusable=True)
    assert await pool.acquire(A, wait=0, fresh=True) is None
    assert side.closed  # aged out when the pool was next used
    pool.close()
