"""HTTP/1.1 on a proxy connection (plain or TLS), parsed with ``httptools`` (llhttp, in C).

Every request is bounded before a handler sees it: its request line and headers (431 past
:attr:`HttpLimits.max_head`), its body (413 past :attr:`HttpLimits.max_body`, and all bodies
being read at once share :class:`BodyBudget`, 503 past it), and the time it takes to arrive
(:attr:`HttpLimits.request_seconds`, from the moment the connection waits for it: a client that
says nothing is closed, one caught half-way gets 408). Connections are kept alive between
requests, and every answer says for how long (``Keep-Alive: timeout=``, which node's clients
heed: a client that reused a connection the door had just closed would lose its request);
every answer of this layer, an error too, is a JSON body. ``Content-Type`` is not
looked at: Neon's driver sends ``text/plain`` bodies of JSON.

A route may judge a request by its head before its body is read (:data:`HeadCheck`): one it
refuses (a stranger's ``/sql``, say) is answered and closed with its body never read, so a
stranger's megabytes cost the event loop nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httptools

from pgplane.proxy.doors.httpreply import HttpReply, raw_reply, render_reply
from pgplane.proxy.pipe import Side

__all__ = [
    "BodyBudget",
    "Handler",
    "HeadCheck",
    "HttpLimits",
    "HttpReply",
    "HttpRequest",
    "Upgrade",
    "raw_reply",
    "serve_http",
]

log = logging.getLogger(__name__)

_READ = 64 * 1024
_MAX_PIPELINED = 4  # requests read ahead of the one being answered


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
    ticket: object = None  # what the route's HeadCheck established of it, if it ran

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
class Upgrade:
    """The route takes the connection over (a WebSocket): ``run`` is given what the client sent
    after its request and serves the connection to its end."""

    run: Callable[[bytes], Awaitable[None]]


Handler = Callable[[HttpRequest], Awaitable[HttpReply | Upgrade]]
# A route's look at a request whose head is read and whose body is still to come (given with
# an empty body): a refusal, answered at once with the connection closed and the body never
# read; or None and a ticket (a login it proved), handed on as ``HttpRequest.ticket``.
HeadCheck = Callable[[HttpRequest], Awaitable[tuple[HttpReply | None, object]]]


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
    head_check: HeadCheck | None = None,
) -> None:
    """Serve requests on ``client`` until it closes, errs or is taken over; then close it."""

    check = (
        None
        if head_check is None
        else functools.partial(_judge, head_check, client, tls, server_name)
    )
    reader = _Reader(client, limits, budget, check)
    kept = int(limits.request_seconds)  # whole seconds, never past the door's own close
    keep_alive = f"timeout={kept}" if kept > 0 else None
    try:
        while True:
            try:
                try:
                    async with asyncio.timeout(limits.request_seconds or None):
                        request = await reader.next_request()
                except TimeoutError:
                    if not reader.started:
                        return  # kept alive, then silent: closed without a word
                    refusal = HttpReply.error(408, "the request did not arrive in time")
                    raise _Refused(refusal) from None
                if request is None:
                    return
                outcome = await _handle(
                    handler,
                    HttpRequest(
                        method=request.method,
                        target=request.target,
                        headers=request.headers,
                        body=request.body,
                        peer=client.peer_address(),
                        tls=tls,
                        server_name=server_name,
                        ticket=request.ticket,
                    ),
                )
            finally:
                budget.give(reader.held)
                reader.held = 0
            if isinstance(outcome, Upgrade):
                await outcome.run(request.leftover + client.take_buffer())
                return
            client.write(
                render_reply(
                    outcome,
                    head_only=request.method == "HEAD",
                    close=request.close,
                    keep_alive=keep_alive,
                )
            )
            if request.close:
                return
    except _Refused as refused:
        client.write(raw_reply(refused.reply))
        await client.close_after_reply()  # the client may be sending still: a body refused
    finally:
        client.close()


async def _judge(
    head_check: HeadCheck,
    client: Side,
    tls: bool,
    server_name: str | None,
    method: str,
    target: str,
    headers: list[tuple[str, str]],
) -> object:
    """The route's look at a head whose body is to come: its ticket, or _Refused."""
    head = HttpRequest(method, target, headers, b"", client.peer_address(), tls, server_name)
    refusal, ticket = await head_check(head)
    if refusal is not None:
        raise _Refused(refusal)
    return ticket


async def _handle(handler: Handler, request: HttpRequest) -> HttpReply | Upgrade:
    try:
        return await handler(request)
    except Exception:
        log.exception("proxy HTTP request failed: %s %s", request.method, request.path)
        return HttpReply.error(500, "internal proxy error")


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes
    close: bool  # the connection ends after the reply (Connection: close, HTTP/1.0)
    ticket: object = None  # the head check's, when it ran
    leftover: bytes = b""  # what came after an upgrade request


class _Reader:
    """Requests read with ``httptools`` (llhttp, strict: a Content-Length beside a
    Transfer-Encoding, a malformed line or chunk, is a 400), one at a time and bounded: the head
    by what is fed to the parser until it ends (llhttp itself bounds nothing), the body by
    :attr:`HttpLimits.max_body` and the :class:`BodyBudget`. Requests pipelined behind one are
    answered in order, a few at most (no client of this door pipelines): more is a 400."""

    def __init__(
        self,
        client: Side,
        limits: HttpLimits,
        budget: BodyBudget,
        check: Callable[[str, str, list[tuple[str, str]]], Awaitable[object]] | None = None,
    ) -> None:
        self._client = client
        self._check = check
        self._head_read = False  # the current request's head is whole; its body may follow
        self._continue = False  # and its client waits for a 100 Continue to send it
        self._ticket: object = None
        self._limits = limits
        self._budget = budget
        self._parser = httptools.HttpRequestParser(self)
        self._ready: deque[_Request] = deque()
        self.held = 0  # budget taken by bodies read and not yet answered
        self.started = False  # bytes of a request not yet whole have arrived
        self._in_head = False
        self._fed = 0  # bytes fed to the parser while a head was being read
        self._url = bytearray()
        self._headers: list[tuple[str, str]] = []
        self._head = 0
        self._body = bytearray()
        self._eof = False

    async def next_request(self) -> _Request | None:
        """The next whole request; None once the client is done. _Refused for one refused."""
        while not self._ready:
            if self._eof:
                return None
            if self._head_read:
                # A body is still to come: the route judges the head before any more is read,
                # and a client that asked to be told first is told to go on only then.
                self._head_read = False
                if self._check is not None:
                    method = self._parser.get_method().decode("ascii", "replace")
                    target = self._url.decode("ascii", "replace")
                    self._ticket = await self._check(method, target, self._headers)
                if self._continue:
                    self._client.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            data = await self._client.read_some(_READ)
            if not data:
                self._eof = True
                if self.started:
                    raise _Refused(HttpReply.error(400, "malformed request: incomplete"))
                return None
            self._feed(data)
        return self._ready.popleft()

    def _feed(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade as upgrade:
            # The request is whole (on_message_complete ran); what follows is the new protocol.
            if not self._ready:
                raise _Refused(HttpReply.error(400, "malformed request: upgrade")) from None
            self._ready[-1].leftover = data[upgrade.args[0] :]
            self._eof = True  # nothing more is HTTP
            return
        except httptools.HttpParserCallbackError as exc:
            if isinstance(exc.__context__, _Refused):
                raise exc.__context__ from None
            raise _Refused(HttpReply.error(400, "malformed request")) from None
        except httptools.HttpParserError as exc:
            raise _Refused(HttpReply.error(400, f"malformed request: {exc}")) from None
        if self._in_head:
            self._fed += len(data)
            if self._fed > self._limits.max_head:
                raise _Refused(_head_too_large(self._limits))

    # httptools' callbacks -------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if len(self._ready) >= _MAX_PIPELINED:
            raise _Refused(HttpReply.error(400, "too many requests pipelined"))
        self.started = self._in_head = True
        self._head_read, self._ticket = False, None
        self._fed = 0
        self._url, self._headers, self._head, self._body = bytearray(), [], 0, bytearray()

    def on_url(self, url: bytes) -> None:
        self._head += len(url)
        self._url += url
        if self._head > self._limits.max_head:
            raise _Refused(_head_too_large(self._limits))

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head += len(name) + len(value) + 4
        if self._head > self._limits.max_head:
            raise _Refused(_head_too_large(self._limits))
        self._headers.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_read = True
        length = next((v for k, v in self._headers if k == "content-length"), None)
        if length is not None and int(length) > self._limits.max_body:  # llhttp checked it
            raise _Refused(_too_large(self._limits))
        expect = next((v for k, v in self._headers if k == "expect"), "")
        self._continue = (
            expect.lower() == "100-continue" and self._parser.get_http_version() == "1.1"
        )

    def on_body(self, body: bytes) -> None:
        if len(self._body) + len(body) > self._limits.max_body:
            raise _Refused(_too_large(self._limits))
        if not self._budget.take(len(body)):
            raise _Refused(HttpReply.error(503, "the proxy is busy reading other requests"))
        self.held += len(body)
        self._body += body

    def on_message_complete(self) -> None:
        parser = self._parser
        self._ready.append(
            _Request(
                method=parser.get_method().decode("ascii", "replace"),
                target=self._url.decode("ascii", "replace"),
                headers=self._headers,
                body=bytes(self._body),
                close=not parser.should_keep_alive(),
                ticket=self._ticket,
            )
        )
        self.started = self._head_read = False


def _head_too_large(limits: HttpLimits) -> HttpReply:
    message = f"the request line and headers are larger than {limits.max_head} bytes"
    return HttpReply.error(431, message)


def _too_large(limits: HttpLimits) -> HttpReply:
    return HttpReply.error(413, f"the request body is larger than {limits.max_body} bytes")
