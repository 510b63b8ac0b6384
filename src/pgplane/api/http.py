"""The HTTP/1.1 protocol the API is served with: uvicorn's (httptools), with its gaps closed.

- **Errors the protocol answers itself are the JSON error body.** A request too malformed to reach
  the application (a broken request line or header) is answered here, which uvicorn does in
  plain text; like uvicorn's, the answer closes the connection.
- **Connection caps.** A connection past its address's share or the listener's total
  (:class:`~pgplane.connlimits.ConnectionGate`) is answered at once, before a byte of it is read:
  429 (its address has its share) or 503 (the server is full), with ``Retry-After``, then closed.
- **Deadlines** (uvicorn has only the keep-alive timer, armed after a response: a connection that
  never sends a byte, or sends a byte now and then, is never closed). A request's headers must be
  complete within ``header_seconds`` of the connection being made, or of the first byte after the
  previous request; its body within ``body_seconds`` of its headers. Between requests uvicorn's
  keep-alive timer is the idle deadline. Where the deadline strikes a request the client has begun
  and nothing else is being answered on the connection, the answer is 408 with the error body;
  otherwise (nothing begun, or a response already under way) the connection is just closed.
"""

from __future__ import annotations

import asyncio
import http
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from pgplane.api.schemas import ErrorBody
from pgplane.connlimits import Admission, ConnectionGate, Refusal
from pgplane.errors import BadRequest, TooManyRequests, Unavailable

MALFORMED = "malformed HTTP request: the request line or a header could not be parsed"
REQUEST_TIMEOUT = "REQUEST_TIMEOUT"  # 408's code: only the protocol gives it, so not in errors.py
_RETRY_AFTER = 1  # seconds: places free as other connections end


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Deadlines in seconds (0: none) and the connection gate of one API listener."""

    header_seconds: float = 0.0
    body_seconds: float = 0.0
    gate: ConnectionGate | None = None


def protocol_with(limits: HttpLimits) -> type[HttpProtocol]:
    """The protocol class for uvicorn's ``http``, holding ``limits`` (uvicorn builds protocols
    itself, from the class, with its own arguments)."""

    class Limited(HttpProtocol):
        _limits = limits

    return Limited


class HttpProtocol(HttpToolsProtocol):
    _limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._admission: Admission | None = None
        self._refused = False
        self._deadline: asyncio.TimerHandle | None = None
        self._in_body = False  # a request's headers are complete, its body is not
        self._request_begun = False  # bytes of a request (not only blank lines) have come
        self._completed = False  # a request was completed by the read being parsed

    # connection -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        gate = self._limits.gate
        if gate is not None:
            peer = transport.get_extra_info("peername")
            admission = gate.admit(peer[0] if isinstance(peer, tuple) else None)
            if admission is None:
                self._refuse(transport, gate)
                return
            self._admission = admission
        super().connection_made(transport)
        self._arm(self._limits.header_seconds, self._header_expired)

    def _refuse(self, transport: asyncio.Transport, gate: ConnectionGate) -> None:
        self.transport = transport
        self._refused = True
        error = TooManyRequests if gate.last_refusal is Refusal.PER_ADDRESS else Unavailable
        self._send_error(
            error.status,
            error.code,
            gate.refusal_message(),
            extra=((b"retry-after", b"%d" % _RETRY_AFTER),),
        )

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._admission is not None:
            self._admission.release()
            self._admission = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # closing; nothing of it is read
        self._completed = False
        super().data_received(data)
        # The deadline for what this read left unfinished, armed once the parser has seen it: a
        # request that comes whole in one read (nearly every one) arms and cancels no timer.
        if self._deadline is not None or self.transport.is_closing():
            return
        if self._in_body:  # its headers are complete, its body is not
            self._arm(self._limits.body_seconds, self._body_expired)
        elif self._request_begun or not self._completed:
            # Part of a request's headers, or bytes that began none (a blank line counts:
            # uvicorn's keep-alive timer stops at any byte, so bytes that never begin a request
            # would hold the connection for ever).
            self._arm(self._limits.header_seconds, self._header_expired)

    # parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._request_begun = True

    def on_headers_complete(self) -> None:
        self._disarm()  # the headers' deadline, when an earlier read left them unfinished
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # the body's deadline, when an earlier read left it unfinished
        self._in_body = False
        self._request_begun = False
        self._completed = True
        super().on_message_complete()

    # deadlines ----------------------------------------------------------------------------
    def _arm(self, seconds: float, expired: Callable[[], None]) -> None:
        self._disarm()
        if seconds > 0:
            self._deadline = self.loop.call_later(seconds, expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_expired(self) -> None:
        self._deadline = None
        cycle = self.cycle
        answering = cycle is not None and not cycle.response_complete
        self._expire(self._request_begun and not answering, "headers")

    def _body_expired(self) -> None:
        self._deadline = None
        cycle = self.cycle
        # The application waits for the body and has not answered; nothing queued behind it. The
        # closing connection tells the application its client is gone.
        free = cycle is not None and not cycle.response_started and not self.pipeline
        self._expire(free, "body")

    def _expire(self, answer: bool, part: str) -> None:
        if self.transport.is_closing():
            return
        if not answer:
            self.transport.close()
            return
        seconds = self._limits.header_seconds if part == "headers" else self._limits.body_seconds
        self._send_error(
            408, REQUEST_TIMEOUT, f"request timeout: the {part} did not arrive within {seconds:g} s"
        )

    # answers ------------------------------------------------------------------------------
    def send_400_response(self, msg: str) -> None:
        self._send_error(400, BadRequest.code, MALFORMED)

    def _send_error(
        self, status: int, code: str, message: str, extra: tuple[tuple[bytes, bytes], ...] = ()
    ) -> None:
        """The error body, then close: the connection is in no state to go on."""
        self._disarm()
        body = msgspec.json.encode(
            ErrorBody(code=code, message=message, request_id=uuid.uuid4().hex)
        )
        phrase = http.HTTPStatus(status).phrase.encode()
        head = [b"HTTP/1.1 %d %s\r\n" % (status, phrase)]
        for name, value in [*self.server_state.default_headers, *extra]:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
