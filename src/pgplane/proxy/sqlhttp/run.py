"""A request's queries run on a logged-in compute connection, bounded in size and time.

All of a request's messages go in one write and end in one Sync: a batch is ``BEGIN``, its
queries and ``COMMIT`` in one pipeline, so after an error Postgres skips the rest up to the Sync
(nothing after a failed query runs, whatever it says) and the proxy rolls the transaction back.
On a pooled connection the pipeline begins with the reset of what the last request left
(:mod:`pgplane.proxy.sqlhttp.reset`), whose answer is read first: if it failed, none of the
request ran, and the request is tried again on a new connection (:class:`Stale`).

Past the response bound or the time bound the compute's query is cancelled (a CancelRequest, as
a client would send), what it still sends is read and thrown away, and the connection goes back
to the pool only if it ends ready and idle; else it is closed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from pgplane.errors import ResponseTooLarge, SqlFailed
from pgplane.proxy import wire
from pgplane.proxy.framing import FrameError
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp import messages, render, reset
from pgplane.proxy.sqlhttp.frames import Frames
from pgplane.proxy.sqlhttp.request import Query, SqlRequest

# How long a cancelled query may take to stop before its connection is closed instead.
DRAIN_SECONDS = 5.0
_YIELD_EVERY = 256  # rows rendered between two yields to the event loop
QUERY_CANCELED = "57014"
_GOING_DOWN = frozenset({wire.ADMIN_SHUTDOWN, wire.CRASH_SHUTDOWN, wire.CANNOT_CONNECT_NOW})


@dataclass(frozen=True, slots=True)
class Limits:
    """What one request may take: its body, its answer (bytes and rows) and its time."""

    request_bytes: int = 10 << 20
    response_bytes: int = 10 << 20
    rows: int = 1_000_000
    seconds: float = 15.0


class Stale(Exception):
    """A pooled connection ran nothing of the request: it was found closing (its compute
    suspended or restarted), or its reset failed. The request may be tried again on a new
    connection.

    Known only from what the compute says first: a shutdown's error (or notice) before any reply
    to the request, or an error before the reset's CommandComplete (Postgres skips the rest of
    the pipeline after it). Postgres answers a request's messages in order, so had any of it
    run, its ParseComplete would have come first. A connection that just closes says nothing of
    what ran (a backend killed after a commit, before its reply), so that is not Stale."""


@dataclass(slots=True)
class Outcome:
    body: str
    reusable: bool  # the connection ended ready and idle, outside any transaction


Cancel = Callable[[], Coroutine[Any, Any, None]]
_cancels: set[asyncio.Task[None]] = set()


async def execute(
    side: Side, request: SqlRequest, limits: Limits, *, cancel: Cancel, reset_first: bool
) -> Outcome:
    """Run the request, after a reset of the session with ``reset_first``; its JSON answer, or
    SqlFailed / ResponseTooLarge / Stale.

    Whatever ends it, the connection is either left ready and idle (``reusable``) or must be
    closed by the caller: after an exception it is reusable only if the exception says so.
    """
    reader = _Reader(side, request, limits, cancel, reset_first=reset_first)
    side.write(_pipeline(request, reset_first=reset_first))
    # Read in this task (no task of its own per request: it costs more than a small query):
    # at the time limit the query is cancelled on the compute and what it still sends is
    # drained, for DRAIN_SECONDS more at most.
    stop = asyncio.get_running_loop().call_later(limits.seconds, reader.stop, "time")
    try:
        async with asyncio.timeout(limits.seconds + DRAIN_SECONDS):
            return await reader.read()
    except TimeoutError:
        reader.fire_cancel()  # the query would not stop: stop what runs on the compute
        raise SqlFailed(_timed_out(limits), {"code": QUERY_CANCELED}) from None
    except asyncio.CancelledError:
        reader.fire_cancel()  # the client went away: the same
        raise
    finally:
        stop.cancel()


def _timed_out(limits: Limits) -> str:
    return (
        f"the query ran past {limits.seconds:g} s, the time limit of SQL over HTTP, and was"
        " cancelled"
    )


def _pipeline(request: SqlRequest, *, reset_first: bool) -> bytes:
    parts = [reset.AHEAD] if reset_first else []
    if request.batch is not None:
        parts.append(messages.statement(request.batch.begin()))
    parts.extend(messages.query(q.text, q.params) for q in request.queries)
    if request.batch is not None:
        parts.append(messages.statement("COMMIT"))
    parts.append(messages.SYNC)
    return b"".join(parts)


class _Reader:
    def __init__(
        self,
        side: Side,
        request: SqlRequest,
        limits: Limits,
        cancel: Cancel,
        *,
        reset_first: bool,
    ) -> None:
        self._side = side
        self._reset_first = reset_first
        self._request = request
        self._limits = limits
        self._cancel = cancel
        self._cancelling: asyncio.Task[None] | None = None
        self._stopped: str | None = None  # why the query was cancelled: "time" or "size"
        # The steps whose replies come, in order: None for the proxy's BEGIN and COMMIT.
        steps: list[Query | None] = list(request.queries)
        self._steps = [None, *steps, None] if request.batch is not None else steps
        self._results: list[str] = []
        self._size = 0
        self._rows = 0
        self._frames = Frames(side, limit=limits.response_bytes + (1 << 16))
        # The step being answered, its fields (JSON), its rows (JSON each) as they come.
        self._at = 0
        self._fields = "[]"
        self._writer: render.RowWriter | None = None
        self._rows_json: list[str] = []

    def stop(self, why: str) -> None:
        if self._stopped is None:
            self._stopped = why
            self.fire_cancel()

    def fire_cancel(self) -> None:
        if self._cancelling is None:
            self._cancelling = asyncio.get_running_loop().create_task(self._cancel())
            # Held until done: the request may be answered (and this reader gone) before.
            _cancels.add(self._cancelling)
            self._cancelling.add_done_callback(_cancels.discard)

    async def read(self) -> Outcome:
        try:
            first = await self._first()
            if self._reset_first:
                first = await self._past_reset(*first)
            error, status = await self._until_ready(*first)
        except FrameError:
            # A row larger than the whole answer may be: the connection is mid-message.
            raise ResponseTooLarge(self._too_large()) from None
        if status != b"I" and (error is not None or self._stopped is not None):
            self._side.write(messages.simple_query("ROLLBACK"))
            _, status = await self._until_ready(*await self._frames.next())
        # Ready and idle, and silent since: a session that spoke after its answer is ending.
        reusable = status == b"I" and not self._frames.pending()
        if self._stopped == "time":
            raise _Reusable(SqlFailed(_timed_out(self._limits), {"code": QUERY_CANCELED}), reusable)
        if self._stopped == "size":
            raise _Reusable(ResponseTooLarge(self._too_large()), reusable)
        if error is not None:
            message = error.get("M", "query failed")
            raise _Reusable(SqlFailed(message, render.error_fields(error)), reusable)
        if len(self._results) != len(self._request.queries):  # never, from a sane compute
            raise messages.MalformedMessage("a query got no answer")
        if self._request.batch is None:
            return Outcome(self._results[0], reusable)
        return Outcome('{"results":[' + ",".join(self._results) + "]}", reusable)

    def _too_large(self) -> str:
        return (
            f"response is too large (max is {self._limits.response_bytes} bytes or"
            f" {self._limits.rows} rows): select fewer rows or columns, or page with LIMIT"
        )

    async def _first(self) -> tuple[bytes, bytes]:
        """The first message of the reply; Stale if the compute says first that it is ending."""
        ending = False
        try:
            while True:
                kind, payload = await self._frames.next()
                if kind not in (b"E", b"N"):
                    return kind, payload
                code = wire.error_fields(payload).get("C")
                if code not in _GOING_DOWN:
                    return kind, payload
                if kind == b"E":
                    raise Stale(code)
                ending = True  # a crash's notice (57P02): the close follows
        except (Closed, ConnectionError):
            if ending:
                raise Stale("closed") from None
            raise

    async def _past_reset(self, kind: bytes, payload: bytes) -> tuple[bytes, bytes]:
        """Read the reset's answer, from the message read already; the first message after it.
        Stale if it failed: Postgres then skipped the request's messages up to their Sync."""
        read = self._frames.next
        while True:
            if kind == b"E":
                raise Stale(wire.error_fields(payload).get("C", "reset failed"))
            if kind == b"C":
                if payload != reset.DONE:
                    raise messages.MalformedMessage("the reset got another command's answer")
                return await read()
            if kind not in (b"1", b"2") and kind not in reset.ASIDES:
                raise messages.MalformedMessage(f"the reset got a {kind!r} message")
            kind, payload = await read()

    async def _until_ready(
        self, kind: bytes, payload: bytes
    ) -> tuple[dict[str, str] | None, bytes]:
        """Read up to ReadyForQuery, from the message read already: the first error, and the
        transaction status."""
        error: dict[str, str] | None = None
        frames = self._frames
        while True:
            if kind == b"D":
                if self._writer is not None and self._stopped is None:
                    self._row(payload, self._writer)
                    if self._rows % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)
            elif kind == b"T":
                self._describe(payload)
            elif kind in (b"C", b"I"):
                self._complete(messages.command_tag(payload) if kind == b"C" else ("", None))
            elif kind == b"d":  # COPY TO STDOUT's data: counted, not kept
                self._size += len(payload)
                if self._size > self._limits.response_bytes:
                    self.stop("size")
            elif kind == b"G":  # COPY FROM STDIN waits for data the request cannot send
                self._side.write(messages.copy_fail("COPY FROM STDIN is not supported over HTTP"))
            elif kind == b"E":
                error = error or wire.error_fields(payload)
            elif kind == b"Z":
                return error, payload[:1]
            # ParseComplete, BindComplete, NoData, notices, parameter statuses: nothing to do.
            # Every message that has arrived is taken without a wait; the connection is awaited
            # only when none has.
            message = frames.take()
            while message is None:
                await frames.fill()
                message = frames.take()
            kind, payload = message

    def _row(self, payload: bytes, writer: render.RowWriter) -> None:
        row = writer.row(messages.data_row(payload))
        self._rows_json.append(row)
        self._size += len(row) + 1
        self._rows += 1
        if self._size > self._limits.response_bytes or self._rows > self._limits.rows:
            self.stop("size")
            self._rows_json.clear()

    def _describe(self, payload: bytes) -> None:
        query = self._step()
        described = messages.row_description(payload)
        self._fields = render.fields_json(described)
        if query is not None:
            self._writer = render.RowWriter(
                described, array_mode=query.array_mode, raw_text=self._request.raw_text
            )

    def _complete(self, tag: tuple[str, int | None]) -> None:
        query = self._step()
        if query is not None and self._stopped is None:
            rows = self._rows_json
            result = render.result_json(*tag, self._fields, rows, query.array_mode)
            self._results.append(result)
            self._size += len(result) - sum(len(r) + 1 for r in rows)
        self._at += 1
        self._fields, self._writer, self._rows_json = "[]", None, []

    def _step(self) -> Query | None:
        return self._steps[self._at] if self._at < len(self._steps) else None


class _Reusable(Exception):
    """An error to answer with, and whether the connection may still be pooled."""

    def __init__(self, error: Exception, reusable: bool) -> None:
        super().__init__(str(error))
        self.error = error
        self.reusable = reusable


def unwrap(exc: BaseException) -> tuple[BaseException, bool]:
    """The error to answer with and whether the connection may be pooled after it."""
    if isinstance(exc, _Reusable):
        return exc.error, exc.reusable
    return exc, False
