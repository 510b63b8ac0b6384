"""The WebSocket door: ``GET /v2`` upgraded, its binary frames carrying the Postgres protocol from
the StartupMessage on, as Neon's serverless driver sends it. The handshake is the ``websockets``
library's (its sans-IO protocol); the frames after it, the proxy's own (:mod:`.wsframes`: pings,
the closing handshake and every check on a client's frames, without the library's per-frame
cost).

The endpoint is named by the request's ``Host`` (``ep-x.<proxy_host>``, ``-pooler`` or not), else
by the startup's ``options=endpoint=``, else by the ``address=`` query parameter the driver adds
for a string ``wsProxy``. The password is asked for in clear: the layer below is the proxy's TLS
(or the user chose ``ws://``), and the driver pipelines a cleartext password by default.

Frames are bounded: small until the login is proven (:data:`LOGIN_FRAME`), then
:data:`MAX_FRAME`; a larger one closes the connection (1009). Each frame's payload goes on as it
arrives, so a message of many frames is never held whole. A slow reader on either side pauses the
other, as on TCP (:mod:`pgplane.proxy.pipe`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from urllib.parse import parse_qsl

from websockets.datastructures import Headers
from websockets.http11 import Request
from websockets.server import ServerProtocol

from pgplane.proxy import wire
from pgplane.proxy.activity import Session
from pgplane.proxy.doors import wsframes
from pgplane.proxy.doors.http import HttpReply, HttpRequest
from pgplane.proxy.doors.wsframes import Frames
from pgplane.proxy.pipe import LINGER, Side, Sink

# The library logs every connection opened at INFO: one line per client is not the proxy's way.
_library_log = logging.getLogger(__name__ + ".library")
_library_log.setLevel(logging.WARNING)

LOGIN_FRAME = 64 * 1024  # a StartupMessage (10 000 at most) and a password message fit
MAX_FRAME = 16 << 20  # tungstenite's default, which Neon's proxy runs with


def handshake(request: HttpRequest) -> tuple[Frames, bytes] | HttpReply:
    """Accept the upgrade: the reader of the client's frames, and the 101 response (sent once
    the caller takes the connection over); or the JSON refusal of a request that is no
    WebSocket handshake."""
    # No extensions: compression would cost memory and CPU at a rate the client sets.
    checker = ServerProtocol(logger=_library_log)
    response = checker.accept(Request(path=request.target, headers=Headers(request.headers)))
    if response.status_code != 101:
        reason = str(checker.handshake_exc) if checker.handshake_exc else "bad handshake"
        return HttpReply.error(400, f"WebSocket handshake refused: {reason}")
    checker.send_response(response)
    # The frames after it are read by the proxy's own reader (wsframes: the hot path).
    return Frames(max_frame=LOGIN_FRAME), b"".join(checker.data_to_send())


def endpoints(request: HttpRequest, proxy_host: str) -> tuple[str | None, str | None]:
    """The endpoint the ``Host`` names, and the one ``address=`` names."""
    host = (request.header("host") or "").rpartition(":")
    address = dict(parse_qsl(request.query)).get("address", "").rpartition(":")
    return (
        wire.endpoint_from_sni(host[0] or host[2], proxy_host),
        wire.endpoint_from_sni(address[0] or address[2], proxy_host),
    )


class WebSocketSide(Side):
    """A client on a WebSocket, seen by the session steps as a client on TCP: the payloads of
    its frames are its bytes, and what is written to it goes out as binary frames."""

    def __init__(self, frames: Frames) -> None:
        super().__init__()
        self._frames = frames
        self._framed = _Framed(self)
        self._closing = False  # our closing frame is sent: nothing more is
        self._writes_paused = False

    @classmethod
    def take_over(cls, raw: Side, frames: Frames, response: bytes, leftover: bytes) -> Side:
        """Move ``raw``'s connection to a WebSocket side; ``leftover``: bytes the client sent
        after its handshake request."""
        side = cls(frames)
        transport = raw.transport
        transport.set_protocol(side)
        side.connection_made(transport)
        transport.write(response)
        if raw.lost.done():
            side.connection_lost(None)
            return side
        if leftover:
            side.data_received(leftover)
        if not transport.is_closing():
            transport.resume_reading()  # the HTTP side may have paused it
        return side

    def data_received(self, data: bytes) -> None:
        try:
            payload, control = self._frames.receive(data)
        except wsframes.FrameError as exc:
            self._fail(exc.code, exc.reason)
            return
        if payload:
            self._received(payload[0] if len(payload) == 1 else b"".join(payload))
        for opcode, body in control:
            if opcode == wsframes.PING and not self._closing and not self._writes_paused:
                # A client that does not read its pongs gets none (RFC 6455 allows answering
                # only some pings): what it sends cannot fill the proxy's buffer.
                self._send(wsframes.frame(wsframes.PONG, body))
            elif opcode == wsframes.CLOSE:
                # The closing handshake: answered (unless ours went first), then the server
                # ends the connection.
                if not self._closing:
                    code = body[:2] if body else b""
                    self._send(wsframes.frame(wsframes.CLOSE, code))
                    self._closing = True
                super().close()

    def _fail(self, code: int, reason: str) -> None:
        if not self._closing:
            self._send(wsframes.close_frame(code, reason))
            self._closing = True
        super().close()

    def _send(self, data: bytes) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        if len(data) < _JOINED:
            self._send(wsframes.frame(wsframes.BINARY, data))
        else:  # not copied into one buffer with its header
            self._send(wsframes.header(wsframes.BINARY, len(data)))
            self._send(data)

    def close(self) -> None:
        if not self._closing:
            self._send(wsframes.close_frame(wsframes.NORMAL_CLOSURE))
            self._closing = True
        super().close()

    async def close_after_reply(self, linger: float = LINGER) -> None:
        # The closing handshake: the client answers the closing frame once it has read what
        # came before, and the connection then ends (data_received).
        try:
            if not self._closing:
                self._send(wsframes.close_frame(wsframes.NORMAL_CLOSURE))
                self._closing = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(linger):
                    await asyncio.shield(self.lost)
        finally:
            super().close()

    def pause_writing(self) -> None:
        self._writes_paused = True
        super().pause_writing()

    def resume_writing(self) -> None:
        self._writes_paused = False
        super().resume_writing()

    def sink(self) -> Sink:
        return self._framed

    def pipe_to(
        self,
        peer: Side,
        session: Session,
        sniff: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._frames.max_frame = MAX_FRAME  # logged in: frames as large as queries need
        super().pipe_to(peer, session, sniff)


_JOINED = 16 * 1024  # a payload up to this is sent in one write with its header


class _Framed:
    """What the compute's side writes into: binary frames to the client."""

    def __init__(self, side: WebSocketSide) -> None:
        self._side = side

    def write(self, data: bytes) -> None:
        self._side.write(data)

    def close(self) -> None:
        self._side.close()

    def pause_reading(self) -> None:
        self._side.transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self._side.transport
        if not transport.is_closing():
            transport.resume_reading()
