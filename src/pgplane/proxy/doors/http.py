"""HTTP/1.1 on a proxy connection (plain or TLS), with the sans-IO ``h11`` parser.

Every request is bounded before a handler sees it: its request line and headers (431 past
:attr:`HttpLimits.max_head`), its body (413 past :attr:`HttpLimits.max_body`, and all bodies
being read at once share :class:`BodyBudget`, 503 past it), and the time it takes to arrive
(:attr:`HttpLimits.request_seconds`, from the moment the connection waits for it: a client that
says nothing is closed, one caught half-way gets 408). Connections are kept alive between
requests; every answer of this layer, an error too, is a JSON body. ``Content-Type`` is not
looked at: Neon's driver sends ``text/plain`` bodies of JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import h11

from pgplane.proxy.pipe import Side

log = logging.getLogger(__name__)

_READ = 64 * 1024
_REASONS = {
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    429: "Too Many Requests",
    413: "Payload Too Large",
    426: "Upgrade Required",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_CODES = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "REQUEST_TIMEOUT",
    429: "TOO_MANY_REQUESTS",
    413: "PAYLOAD_TOO_LARGE",
    431: "REQUEST_HEADER_FIELDS_TOO_LARGE",
    500: "INTERNAL",
    503: "SERVICE_UNAVAILABLE",
}


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_head: int = 16 * 1024  # request line and headers
    max_body: int = 10 << 20  # as Neon's proxy takes for /sql
    request_seconds: float = 30.0


class BodyBudget:
    """Bytes of request bodies held at once, over every HTTP connection of the proxy: a body
    that would take more is refused (503), so a crowd of large uploads cannot fill memory."""

    def __init__(self, total: int = 256 << 20) -> None:
        self.total = total
        self.held = 0

    def take(self, n: int) -> bool:
        if self.held + n > self.total:
            return False
        self.held += n
        return True

    def give(self, n: int) -> None:
        self.held -= n


@dataclass(frozen=True, slots=True)
class HttpRequest:
    method: str
    target: str  # the request target as sent: path and query
    headers: list[tuple[str, str]]  # names lower-case, in order, repeats kept
    body: bytes
    peer: str  # the client's address
    tls: bool
    server_name: str | None = None  # SNI, on TLS

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    @property
    def query(self) -> str:
        return self.target.partition("?")[2]

    def header(self, name: str) -> str | None:
        """The first value of header ``name`` (lower-case), or None."""
        return next((v for k, v in self.headers if k == name), None)


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)  # besides the body's own

    @classmethod
    def json(
        cls, status: int, value: Any, headers: list[tuple[str, str]] | None = None
    ) -> HttpReply:
        return cls(status, json.dumps(value).encode(), headers or [])

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        code: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> HttpReply:
        body = {"code": code or _CODES.get(status, "ERROR"), "message": message}
        return cls.json(status, body, headers)


@dataclass(frozen=True, slots=True)
class Upgrade:
    """The route takes the connection over (a WebSocket): ``run`` is given what the client sent
    after its request and serves the connection to its end."""

    run: Callable[[bytes], Awaitable[None]]


Handler = Callable[[HttpRequest], Awaitable[HttpReply | Upgrade]]


class _Refused(Exception):
    def __init__(self, reply: HttpReply) -> None:
        super().__init__(reply.status)
        self.reply = reply


async def serve_http(
    client: Side,
    handler: Handler,
    *,
    limits: HttpLimits,
    budget: BodyBudget,
    tls: bool,
    server_name: str | None,
) -> None:
    """Serve requests on ``client`` until it closes, errs or is taken over; then close it."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head)
    try:
        while True:
            held = [0]
            try:
                try:
                    async with asyncio.timeout(limits.request_seconds or None):
                        request = await _read_request(client, conn, limits, budget, held)
                except TimeoutError:
                    if conn.their_state is h11.IDLE and not conn.trailing_data[0]:
                        return  # kept alive, then silent: closed without a word
                    refusal = HttpReply.error(408, "the request did not arrive in time")
                    raise _Refused(refusal) from None
                except h11.RemoteProtocolError as exc:
                    status = exc.error_status_hint if exc.error_status_hint in _REASONS else 400
                    if status == 431:
                        raise _Refused(_head_too_large(limits)) from None
                    refusal = HttpReply.error(status, f"malformed request: {exc}")
                    raise _Refused(refusal) from None
                if request is None:
                    return
                outcome = await _handle(
                    handler,
                    HttpRequest(
                        method=request.method.decode("ascii", "replace"),
                        target=request.target.decode("ascii", "replace"),
                        headers=[
                            (k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers
                        ],
                        body=request.body,
                        peer=client.peer_address(),
                        tls=tls,
                        server_name=server_name,
                    ),
                )
            finally:
                budget.give(held[0])
            if isinstance(outcome, Upgrade):
                await outcome.run(conn.trailing_data[0] + client.take_buffer())
                return
            client.write(_reply(conn, outcome))
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
    except _Refused as refused:
        client.write(raw_reply(refused.reply))
        await client.close_after_reply()  # the client may be sending still: a body refused
    finally:
        client.close()


async def _handle(handler: Handler, request: HttpRequest) -> HttpReply | Upgrade:
    try:
        return await handler(request)
    except Exception:
        log.exception("proxy HTTP request failed: %s %s", request.method, request.path)
        return HttpReply.error(500, "internal proxy error")


@dataclass(slots=True)
class _Request:
    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes


async def _read_request(
    client: Side, conn: h11.Connection, limits: HttpLimits, budget: BodyBudget, held: list[int]
) -> _Request | None:
    """The next whole request (None once the client is done); the budget its body takes is
    added to ``held[0]``, for the caller to give back."""
    request: _Request | None = None
    body = bytearray()
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await client.read_some(_READ))
        elif isinstance(event, h11.ConnectionClosed) or (event is h11.PAUSED and request is None):
            return None
        elif isinstance(event, h11.Request):
            request = _Request(event.method, event.target, list(event.headers), b"")
            # h11 bounds a head that is still arriving; one that came in a single read is
            # measured here.
            head = len(event.target) + sum(len(k) + len(v) + 4 for k, v in request.headers)
            if head > limits.max_head:
                raise _Refused(_head_too_large(limits))
            length = _content_length(request.headers)
            if length is not None and length > limits.max_body:
                raise _Refused(_too_large(limits))
            if conn.they_are_waiting_for_100_continue:
                client.write(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        elif isinstance(event, h11.Data):
            if len(body) + len(event.data) > limits.max_body:
                raise _Refused(_too_large(limits))
            if not budget.take(len(event.data)):
                raise _Refused(HttpReply.error(503, "the proxy is busy reading other requests"))
            held[0] += len(event.data)
            body += event.data
        elif request is not None:  # EndOfMessage, or PAUSED after it (an upgrade)
            request.body = bytes(body)
            return request


def _content_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is a number
    return None


def _head_too_large(limits: HttpLimits) -> HttpReply:
    message = f"the request line and headers are larger than {limits.max_head} bytes"
    return HttpReply.error(431, message)


def _too_large(limits: HttpLimits) -> HttpReply:
    return HttpReply.error(413, f"the request body is larger than {limits.max_body} bytes")


def _headers(reply: HttpReply) -> list[tuple[str, str]]:
    return [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(reply.body))),
        *reply.headers,
    ]


def _reply(conn: h11.Connection, reply: HttpReply) -> bytes:
    head = h11.Response(status_code=reply.status, headers=_headers(reply))
    return conn.send(head) + conn.send(h11.Data(data=reply.body)) + conn.send(h11.EndOfMessage())


def raw_reply(reply: HttpReply) -> bytes:
    """A reply written without the parser's state (it may be broken): the connection closes."""
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}"]
    lines += [f"{k}: {v}" for k, v in [*_headers(reply), ("Connection", "close")]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body
