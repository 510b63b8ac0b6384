"""SQL over HTTP on a pooled connection, at the bytes: the reset after a request is verified
before the connection is trusted again, and a request is tried again only when the compute said
it was ending before anything of the request ran."""

from __future__ import annotations

import asyncio

import pytest

from pgplane.proxy import wire
from pgplane.proxy.framing import frame
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp.request import Login, Query, SqlRequest
from pgplane.proxy.sqlhttp.reset import RESET, discard_all
from pgplane.proxy.sqlhttp.run import Limits, Stale, execute

READY = frame(b"Z", b"I")
DISCARDED = frame(b"C", b"DISCARD ALL\0")
PARSED = frame(b"1", b"")
SHUTDOWN = wire.error_response(wire.ADMIN_SHUTDOWN, "terminating connection")


class _Transport:
    def __init__(self) -> None:
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> None:
        return None


def _side() -> tuple[Side, _Transport]:
    side, transport = Side(), _Transport()
    side.connection_made(transport)  # type: ignore[arg-type]
    return side, transport


async def _reset_with(*replies: bytes, end: bool = False) -> bool:
    side, transport = _side()
    resetting = asyncio.create_task(discard_all(side))
    await asyncio.sleep(0)
    assert transport.written == RESET
    for reply in replies:
        side.data_received(reply)
    if end:
        side.eof_received()
    return await resetting


async def test_a_reset_passes_only_on_its_exact_answer() -> None:
    status = frame(b"S", b"DateStyle\0ISO, MDY\0")  # what RESET ALL put back
    assert await _reset_with(status + DISCARDED + READY)
    # DISCARD ALL refused in a transaction block, a failed one, a shutdown, a close: closed.
    in_block = wire.error_response("25001", "DISCARD ALL cannot run inside a transaction block")
    assert not await _reset_with(in_block + frame(b"Z", b"T"))
    assert not await _reset_with(DISCARDED + frame(b"Z", b"E"))
    assert not await _reset_with(SHUTDOWN, end=True)
    assert not await _reset_with(DISCARDED, end=True)
    # Anything else, or more after ReadyForQuery, is a session not in the state it should be.
    assert not await _reset_with(frame(b"D", b"\0\0") + DISCARDED + READY)
    assert not await _reset_with(frame(b"C", b"SELECT 1\0") + READY)
    assert not await _reset_with(DISCARDED + READY + frame(b"N", b"\0"))


async def _run_with(*replies: bytes) -> str:
    side, _ = _side()
    login = Login("ep-a-1", "alice", "pw", "db")
    request = SqlRequest(login, (Query("SELECT 1", (), True),), None, True, True)

    async def cancel() -> None:
        pass

    running = asyncio.create_task(execute(side, request, Limits(seconds=5), cancel=cancel))
    await asyncio.sleep(0)
    for reply in replies:
        side.data_received(reply)
    side.eof_received()
    return (await running).body


async def test_a_request_is_stale_only_if_the_compute_ended_before_it_ran() -> None:
    with pytest.raises(Stale):
        await _run_with(SHUTDOWN)
    crash = wire.error_response(wire.CRASH_SHUTDOWN, "crash of another", severity="WARNING")
    with pytest.raises(Stale):
        await _run_with(b"N" + crash[1:])  # a crash's notice, then the close
    # Something ran (its ParseComplete came first), or nothing says what happened: no retry.
    with pytest.raises(Closed):
        await _run_with(PARSED + SHUTDOWN)
    with pytest.raises(Closed):
        await _run_with()
