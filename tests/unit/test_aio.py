"""Waiting on an event with a time limit: a cancellation is never lost, an expiry never leaks."""

from __future__ import annotations

import asyncio

import pytest

from pgplane.core import aio


async def _waits_in_a_loop(event: asyncio.Event) -> None:
    while True:
        await aio.wait_event(event, 0.5)
        event.clear()


@pytest.mark.parametrize("turns", range(6))
async def test_a_cancellation_in_the_turn_the_event_is_set_is_not_lost(turns: int) -> None:
    # Python 3.11's wait_for returned the event's result here and dropped the cancellation, so
    # the loop ran on: the engine's shutdown hung this way. Every turn after the set is tried.
    event = asyncio.Event()
    task = asyncio.create_task(_waits_in_a_loop(event))
    await asyncio.sleep(0.01)  # the loop is waiting
    event.set()
    for _ in range(turns):
        await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)  # a guard against a hang, not a timing
    assert done and task.cancelled()


async def test_an_expiry_returns_false_and_leaves_the_caller_uncancelled() -> None:
    event = asyncio.Event()
    assert await aio.wait_event(event, 0.01) is False
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0.02)  # no stray cancellation arrives at the next await
    event.set()
    assert await aio.wait_event(event, 0.01) is True
