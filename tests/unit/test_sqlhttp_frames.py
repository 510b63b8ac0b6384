"""A compute connection's messages as SQL over HTTP reads them: whole ones taken without a wait,
split ones completed across reads, a large one joined once, bounded by its header, and bytes
past the last message taken still known."""

from __future__ import annotations

import asyncio

import pytest

from pgplane.proxy.framing import FrameError, frame
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp.frames import Frames
from tests.unit.test_sqlhttp_reset import _side

READY = frame(b"Z", b"I")
DONE = frame(b"C", b"SELECT 1\0")


async def _reading(side: Side, frames: Frames) -> asyncio.Task[tuple[bytes, bytes]]:
    task = asyncio.create_task(frames.next())
    await asyncio.sleep(0)
    assert not task.done()  # nothing whole yet: it waits for the connection
    return task


async def test_whole_messages_are_taken_and_split_ones_completed() -> None:
    side, _ = _side()
    frames = Frames(side, limit=1000)
    assert frames.take() is None and not frames.pending()
    side.data_received(DONE + READY[:3])
    assert await frames.next() == (b"C", b"SELECT 1\0")  # one read, had at once
    assert frames.take() is None and frames.pending()  # half of ReadyForQuery is in
    reading = await _reading(side, frames)
    side.data_received(READY[3:] + b"N")
    assert await reading == (b"Z", b"I")
    assert frames.pending()  # a byte past it: the session spoke after its answer


async def test_a_large_message_is_joined_from_many_reads() -> None:
    side, _ = _side()
    frames = Frames(side, limit=1 << 20)
    row = frame(b"D", b"x" * 500_000)
    side.data_received(row[:10])
    reading = await _reading(side, frames)
    for at in range(10, len(row), 65536):
        side.data_received(row[at : at + 65536])
        await asyncio.sleep(0)
    side.data_received(READY)
    assert await reading == (b"D", b"x" * 500_000)
    assert await frames.next() == (b"Z", b"I") and not frames.pending()


async def test_a_message_past_the_bound_is_refused_by_its_header() -> None:
    side, _ = _side()
    frames = Frames(side, limit=1000)
    side.data_received(frame(b"D", b"x" * 2000)[:5])  # only its header has come
    with pytest.raises(FrameError):
        await frames.next()


async def test_the_connection_ending_mid_message_is_closed() -> None:
    side, _ = _side()
    frames = Frames(side, limit=1000)
    side.data_received(DONE[:7])
    reading = await _reading(side, frames)
    side.eof_received()
    with pytest.raises(Closed):
        await reading
