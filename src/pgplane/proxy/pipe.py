"""One side of a proxied connection (client or compute): bounded reads, then a byte pipe.

While the proxy handshakes, what a side sends is buffered for the proxy to read, up to
:data:`HANDSHAKE_BUFFER` bytes: past that the side's reading is paused (TCP back-pressure) until
the proxy has read what it needs, so a client that pours bytes before it is logged in costs a
fixed amount of memory. Once piped, every chunk goes straight to the peer's transport, and a
peer that cannot keep up pauses this side (its write buffer's high-water mark).

Once nothing in a side's bytes is left to notice (the compute's cancel key read), and the
session's activity can be read off the client's TCP connection (:func:`tcp_activity`), the side
hands its transport to :class:`_Forwarding`, whose ``data_received`` *is* the peer's write: on
uvloop each chunk goes from the loop's read callback into the peer transport's write, C to C,
with no Python frame and no count per chunk.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Protocol, cast

from pgplane.proxy.activity import Session
from pgplane.proxy.framing import HEADER, payload_length

HANDSHAKE_BUFFER = 128 * 1024
LINGER = 2.0  # seconds a refused peer has to read its refusal and close
HIGH_WATER = 256 * 1024
_UNPIPED = Session("")


class Closed(Exception):
    """The side's connection ended (or was never made)."""


class Sink(Protocol):
    """Where a piped side's bytes go: its peer's transport, or a peer that frames them (a
    WebSocket); pausing it pauses what the peer reads."""

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class Side(asyncio.Protocol):
    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False
        self._paused = False
        self._peer: Sink | None = None
        self._session: Session | None = None
        self._sniff: Callable[[bytes], bool] | None = None
        # Once piped and nothing left to notice on the way: the peer's write, called with each
        # chunk as it comes (the pipe's whole per-chunk work, with one count for activity).
        self._forward: Callable[[bytes], None] | None = None
        self._ticks = _UNPIPED  # the session, once piped: never None on the per-chunk path
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Set once the transport is there: a task started with the protocol may run first.
        self.made: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @property
    def transport(self) -> asyncio.Transport:
        if self._transport is None:
            raise Closed
        return self._transport

    @transport.setter
    def transport(self, transport: asyncio.Transport) -> None:
        self._transport = transport

    def peer_address(self) -> str:
        """The client's address (its host), "" for a unix socket."""
        peer = None if self._transport is None else self._transport.get_extra_info("peername")
        return str(peer[0]) if isinstance(peer, tuple) and peer else ""

    # asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Stream connections (TCP, unix, TLS) always give a full Transport.
        self._transport = cast(asyncio.Transport, transport)
        if not self.made.done():
            self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        forward = self._forward
        if forward is not None:
            forward(data)
            self._ticks.ticks += 1
            return
        self._received(data)

    def _received(self, data: bytes) -> None:
        """The side's bytes (for a framed side, its frames' payloads): kept for the handshake,
        or passed on to the peer once piped."""
        peer = self._peer
        if peer is not None:
            peer.write(data)
            if self._session is not None:
                self._session.ticks += 1
            if self._sniff is not None and self._sniff(data):
                self._sniff = None
                self._forward = peer.write
                self._hand_off()
            return
        self._buffer += data
        if len(self._buffer) > HANDSHAKE_BUFFER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._wake()
        if self._peer is not None:
            self._peer.close()
        if not self.lost.done():
            self.lost.set_result(None)

    def pause_writing(self) -> None:
        # Our transport's buffer is full: stop reading from whoever fills it.
        if self._peer is not None:
            self._peer.pause_reading()

    def resume_writing(self) -> None:
        if self._peer is not None:
            self._peer.resume_reading()

    # handshake ---------------------------------------------------------------------------
    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _resume(self, *, force: bool = False) -> None:
        if self._paused and (force or len(self._buffer) <= HANDSHAKE_BUFFER // 2):
            self._paused = False
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()

    async def read_exactly(self, n: int, *, limit: int = HANDSHAKE_BUFFER) -> bytes:
        """``n`` bytes; Closed past ``limit`` (nothing the proxy reads before piping is as large
        as the default; SQL over HTTP reads a compute's rows, bounded by its own limit)."""
        if n > limit:
            raise Closed
        while len(self._buffer) < n:
            if self._eof:
                raise Closed
            # Waiting for more than the buffer holds: read on, even past the pause mark (only a
            # frame larger than it, allowed by ``limit``, gets here paused: it must arrive).
            self._resume(force=True)
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = bytes(self._buffer[:n])
        del self._buffer[:n]
        self._resume()
        return data

    async def read_frame(self, *, limit: int) -> tuple[bytes, bytes]:
        """One message: its type byte and payload (FrameError past ``limit`` bytes)."""
        header = await self.read_exactly(HEADER)
        length = payload_length(header, limit=limit)
        return header[:1], await self.read_exactly(length, limit=max(limit, HANDSHAKE_BUFFER))

    async def read_some(self, limit: int) -> bytes:
        """What the side has sent so far, at most ``limit`` bytes (at least one); b"" at its end."""
        while not self._buffer:
            if self._eof:
                return b""
            self._resume()
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        data = bytes(self._buffer[:limit])
        del self._buffer[:limit]
        self._resume()
        return data

    def unread(self) -> int:
        """How many bytes the side has sent that were not read yet."""
        return len(self._buffer)

    def take_buffer(self) -> bytes:
        """Everything received and not read yet, removed (for a protocol taking over)."""
        data, self._buffer = bytes(self._buffer), bytearray()
        self._resume()
        return data

    def sink(self) -> Sink:
        """What a side piped to this one writes into."""
        return self.transport

    def write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def close_after_reply(self, linger: float = LINGER) -> None:
        """Close once the peer has had what was written (a refusal), waiting at most ``linger``
        seconds for it to close its side.

        Closed with bytes of the peer's still unread (a pipelined password, a body), the kernel
        would reset the connection, and the peer could lose the reply. Our side is shut for
        writing first where the transport can; what the peer sends meanwhile is held as in the
        handshake (bounded, then reading pauses).
        """
        try:
            transport = self._transport
            if transport is not None and not transport.is_closing() and transport.can_write_eof():
                transport.write_eof()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(linger):
                    await asyncio.shield(self.lost)
        finally:
            self.close()

    def _hand_off(self) -> None:
        """To :class:`_Forwarding`, when the session's activity is counted without us and this
        side's bytes are its own (a framed side's are not: they are decoded first)."""
        session, forward = self._session, self._forward
        if (
            session is not None
            and session.kernel is not None
            and forward is not None
            and type(self).data_received is Side.data_received
            and self._transport is not None
        ):
            self._transport.set_protocol(_Forwarding(self, forward))

    def pipe_to(
        self,
        peer: Side,
        session: Session,
        sniff: Callable[[bytes], bool] | None = None,
    ) -> None:
        """From now on, forward everything this side receives to ``peer``."""
        self._peer = peer.sink()
        self._session = self._ticks = session
        self._sniff = sniff
        self.transport.set_write_buffer_limits(high=HIGH_WATER)
        if self._buffer:
            pending, self._buffer = bytes(self._buffer), bytearray()
            self._received(pending)
        if sniff is None:
            self._forward = self._peer.write
            self._hand_off()
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        if self._eof:
            peer.close()


class _Forwarding(asyncio.Protocol):
    """A piped side's protocol once its chunks need nothing but passing on (see the module)."""

    data_received: Callable[[bytes], None]  # type: ignore[assignment]  # the peer's write

    def __init__(self, side: Side, write: Callable[[bytes], None]) -> None:
        self.data_received = write
        self._side = side

    def eof_received(self) -> bool | None:
        return self._side.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self._side.connection_lost(exc)

    def pause_writing(self) -> None:
        self._side.pause_writing()

    def resume_writing(self) -> None:
        self._side.resume_writing()


_TCP_INFO_LEN = 144  # struct tcp_info up to tcpi_bytes_received (Linux 4.1)
_BYTES_ACKED = 120


def tcp_activity(transport: asyncio.BaseTransport) -> Callable[[], int] | None:
    """A count that moves whenever bytes move on ``transport``'s TCP connection, either way
    (the kernel's ``tcpi_bytes_acked`` and ``tcpi_bytes_received``); None for another kind of
    connection, or a kernel without them."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return None

    def read() -> int | None:
        try:
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        except OSError:
            return None
        if len(info) < _TCP_INFO_LEN:
            return None
        acked, received = struct.unpack_from("=QQ", info, _BYTES_ACKED)
        return int(acked + received)

    last = read()
    if last is None:
        return None

    def count() -> int:
        nonlocal last
        # A closed transport's descriptor may be another connection's by now: its last count.
        if not transport.is_closing():
            last = read() or last
        return cast(int, last)

    return count
