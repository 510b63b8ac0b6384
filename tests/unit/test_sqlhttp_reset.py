"""SQL over HTTP on a pooled connection, at the bytes: the reset goes ahead of a request in its
own pipeline and is read first, an idle connection's reset is verified before the connection is
trusted again, and a request is tried again only when nothing of it ran (the compute said it was
ending first, or the reset ahead of it failed), and a session that spoke past its answer is not
pooled."""

from __future__ import annotations

import asyncio

import pytest

from pgplane.proxy import wire
from pgplane.proxy.framing import frame
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp import messages
from pgplane.proxy.sqlhttp.request import Login, Query, SqlRequest
from pgplane.proxy.sqlhttp.reset import AHEAD, RESET, discard_all
from pgplane.proxy.sqlhttp.run import Limits, Outcome, Stale, execute

READY = frame(b"Z", b"I")
DISCARDED = frame(b"C", b"DISCARD ALL\0")
PARSED = frame(b"1", b"")
BOUND = frame(b"2", b"")
# The answer to SELECT 1 as one row of text.
ANSWER = (
    PARSED
    + BOUND
    + frame(b"T", b"\0\1?column?\0" + bytes(6) + b"\0\0\0\x17\0\4\xff\xff\xff\xff\0\0")
    + frame(b"D", b"\0\1\0\0\0\1" + b"1")
    + frame(b"C", b"SELECT 1\0")
    + READY
)
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


async def _outcome(*replies: bytes, reset_first: bool = False) -> Outcome:
    side, transport = _side()
    login = Login("ep-a-1", "alice", "pw", "db")
    request = SqlRequest(login, (Query("SELECT 1", (), True),), None, True, True)

    async def cancel() -> None:
        pass

    limits = Limits(seconds=5)
    running = asyncio.create_task(
        execute(side, request, limits, cancel=cancel, reset_first=reset_first)
    )
    await asyncio.sleep(0)
    # One write: the reset (when asked) and the request, ended by the request's Sync alone.
    query = messages.query("SELECT 1", ()) + messages.SYNC
    assert transport.written == (AHEAD + query if reset_first else query)
    for reply in replies:
        side.data_received(reply)
    side.eof_received()
    return await running


async def _run_with(*replies: bytes, reset_first: bool = False) -> str:
    return (await _outcome(*replies, reset_first=reset_first)).body


async def test_the_reset_ahead_is_read_before_the_answer() -> None:
    status = frame(b"S", b"TimeZone\0UTC\0")  # what RESET ALL put back
    body = await _run_with(PARSED + BOUND + status + DISCARDED + ANSWER, reset_first=True)
    assert '"rows":[["1"]]' in body
    assert '"rows":[["1"]]' in await _run_with(ANSWER)  # a new session: no reset ahead


async def test_a_failed_reset_ahead_means_nothing_ran() -> None:
    # Refused (a session in a transaction block), or ended: Postgres skipped the rest of the
    # pipeline up to its Sync, so the request may run on another connection.
    in_block = wire.error_response("25001", "DISCARD ALL cannot run inside a transaction block")
    with pytest.raises(Stale):
        await _run_with(PARSED + BOUND + in_block + frame(b"Z", b"T"), reset_first=True)
    with pytest.raises(Stale):
        await _run_with(PARSED + SHUTDOWN, reset_first=True)
    # No word of the reset, or a reply that is not its: what ran is unknown; never retried.
    with pytest.raises(Closed):
        await _run_with(reset_first=True)
    with pytest.raises(messages.MalformedMessage):
        await _run_with(ANSWER, reset_first=True)


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


async def test_a_session_that_spoke_past_its_answer_is_not_pooled() -> None:
    assert (await _outcome(ANSWER)).reusable
    notified = frame(b"A", b"\0\0\0\1leftover\0\0")  # a NOTIFY for a LISTEN left behind
    outcome = await _outcome(ANSWER + notified)
    assert '"rows":[["1"]]' in outcome.body and not outcome.reusable
