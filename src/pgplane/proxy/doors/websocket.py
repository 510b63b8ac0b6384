"""The WebSocket door: ``GET /v2`` upgraded, its binary frames carrying the Postgres protocol from
the StartupMessage on, as Neon's serverless driver sends it; with the sans-IO protocol of the
``websockets`` library (handshake, framing, pings, the closing handshake).

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
from websockets.frames import CloseCode, Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from pgplane.proxy import wire
from pgplane.proxy.activity import Session
from pgplane.proxy.doors.http import HttpReply, HttpRequest
from pgplane.proxy.pipe import LINGER, Side, Sink

# The library logs every connection opened at INFO: one line per client is not the proxy's way.
_library_log = logging.getLogger(__name__ + ".library")
_library_log.setLevel(logging.WARNING)

LOGIN_FRAME = 64 * 1024  # a StartupMessage (10 000 at most) and a password message fit
MAX_FRAME = 16 << 20  # tungstenite's default, which Neon's proxy runs with


def handshake(request: HttpRequest) -> tuple[ServerProtocol, bytes] | HttpReply:
    """Accept the upgrade: the protocol for the frames, and the 101 response (sent once the
    caller takes the connection over); or the JSON refusal of a request that is no WebSocket
    handshake."""
    # No extensions: compression would cost memory and CPU at a rate the client sets.
    checker = ServerProtocol(logger=_library_log)
    response = checker.accept(Request(path=request.target, headers=Headers(request.headers)))
    if response.status_code != 101:
        reason = str(checker.handshake_exc) if checker.handshake_exc else "bad handshake"
        return HttpReply.error(400, f"WebSocket handshake refused: {reason}")
    checker.send_response(response)
    # The request was read by the HTTP door, not by this protocol: the frames go to one that
    # starts open.
    ws = ServerProtocol(state=State.OPEN, max_size=(None, LOGIN_FRAME), logger=_library_log)
    return ws, b"".join(checker.data_to_send())


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

    def __init__(self, ws: ServerProtocol) -> None:
        super().__init__()
        self._ws = ws
        self._framed = _Framed(self)

    @classmethod
    def take_over(cls, raw: Side, ws: ServerProtocol, response: bytes, leftover: bytes) -> Side:
        """Move ``raw``'s connection to a WebSocket side; ``leftover``: bytes the client sent
        after its handshake request."""
        side = cls(ws)
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
        ws = self._ws
        ws.receive_data(data)
        payload = bytearray()
        for frame in ws.events_received():
            if not isinstance(frame, Frame):
                continue  # the handshake's request, taken already
            if frame.opcode in (Opcode.BINARY, Opcode.CONT):
                payload += frame.data
            elif frame.opcode is Opcode.TEXT:
                ws.fail(CloseCode.UNSUPPORTED_DATA, "binary frames only: the Postgres protocol")
        self._flush()
        if payload:
            self._received(bytes(payload))

    def _flush(self) -> None:
        transport = self._transport
        if transport is None:
            return
        for chunk in self._ws.data_to_send():
            if chunk:
                transport.write(chunk)
            else:  # the library's sign that the connection is to end (after a closing frame)
                transport.close()

    def write(self, data: bytes) -> None:
        if self._ws.state is State.OPEN and data:
            self._ws.send_binary(data)
            self._flush()

    def close(self) -> None:
        if self._ws.state is State.OPEN:
            self._ws.send_close(CloseCode.NORMAL_CLOSURE)
            self._flush()
        super().close()

    async def close_after_reply(self, linger: float = LINGER) -> None:
        # The closing handshake: the client answers the closing frame once it has read what
        # came before, and the library then ends the connection (see _flush).
        try:
            if self._ws.state is State.OPEN:
                self._ws.send_close(CloseCode.NORMAL_CLOSURE)
                self._flush()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(linger):
                    await asyncio.shield(self.lost)
        finally:
            super().close()

    def sink(self) -> Sink:
        return self._framed

    def pipe_to(
        self,
        peer: Side,
        session: Session,
        sniff: Callable[[bytes], bool] | None = None,
    ) -> None:
        self._ws.max_fragment_size = MAX_FRAME  # logged in: frames as large as queries need
        super().pipe_to(peer, session, sniff)


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
