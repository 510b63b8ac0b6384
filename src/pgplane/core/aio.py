"""Waiting for an event with a time limit, without losing a cancellation.

On Python 3.11, ``asyncio.wait_for`` returns the awaited result when that finishes in the same
turn as the caller is cancelled, and the cancellation is dropped. A loop that waits on an event
with it cannot be stopped for sure: the operations engine's loop was woken and cancelled in one
turn and ran on, and its shutdown hung (seen in CI). Elsewhere ``asyncio.timeout`` is used, which
keeps a cancellation from outside.
"""

from __future__ import annotations

import asyncio


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """True once ``event`` is set, False after ``seconds``.

    ``asyncio.wait`` only watches the waiter: an expiry does not cancel the caller (which could
    leak into its next await), and the caller's own cancellation goes through untouched.
    """
    if event.is_set():
        return True
    waiter = asyncio.ensure_future(event.wait())
    try:
        done, _ = await asyncio.wait({waiter}, timeout=seconds)
    finally:
        waiter.cancel()
    return bool(done)
