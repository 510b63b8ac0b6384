"""WebSocket frames (RFC 6455) after the handshake: what the Postgres pipe needs of them, with
every check a server owes its client, at the cost of a few slices per frame.

The ``websockets`` library's sans-IO protocol did this with a generator-driven parser, about
10 us per frame in Python, as much as the rest of the proxy's work for a small query: this is
its hot path alone (the handshake stays the library's). Payloads are streamed, not held: each
chunk of a data frame is unmasked and passed on as it arrives, so no frame is ever buffered
whole; only a header (14 bytes at most) or a control frame (131) waits for its end.

What a client is held to (a :class:`FrameError` with the close code, and the connection closed
after a closing frame): every frame masked, no reserved bits (no extension is negotiated),
known opcodes only, control frames whole and at most 125 bytes, continuations only inside a
fragmented message, data frames binary (text is no Postgres: 1003) and at most ``max_frame``
bytes each (1009), a closing frame's code one a peer may send and its reason UTF-8.
"""

from __future__ import annotations

import struct

try:  # the library's C implementation, built with it on every platform it ships wheels for
    from websockets.speedups import apply_mask
except ImportError:  # pragma: no cover
    from websockets.utils import apply_mask

CONTINUATION, TEXT, BINARY, CLOSE, PING, PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
NORMAL_CLOSURE = 1000
PROTOCOL_ERROR = 1002
UNSUPPORTED_DATA = 1003
INVALID_DATA = 1007
MESSAGE_TOO_BIG = 1009
_MAX_CONTROL = 125
_SENDABLE = frozenset({1000, 1001, 1002, 1003, *range(1007, 1015)})  # RFC 6455 7.4, IANA


class FrameError(Exception):
    """The client broke the protocol: close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def header(opcode: int, n: int) -> bytes:
    """The header of a whole frame from the server (FIN, unmasked) of ``n`` payload bytes."""
    if n < 126:
        return bytes((0x80 | opcode, n))
    if n < 1 << 16:
        return struct.pack("!BBH", 0x80 | opcode, 126, n)
    return struct.pack("!BBQ", 0x80 | opcode, 127, n)


def frame(opcode: int, payload: bytes = b"") -> bytes:
    """One whole frame from the server."""
    return header(opcode, len(payload)) + payload


def close_frame(code: int, reason: str = "") -> bytes:
    return frame(CLOSE, struct.pack("!H", code) + reason.encode()[: _MAX_CONTROL - 2])


class Frames:
    """A client's frames, read as they come (:meth:`receive`)."""

    def __init__(self, *, max_frame: int) -> None:
        self.max_frame = max_frame  # a data frame's payload, at most
        self.closed = False  # the client sent its closing frame: nothing after it is read
        self._pending = b""  # an unfinished header or control frame
        self._left = 0  # payload bytes of the current data frame still to come
        self._mask = b""
        self._at = 0  # payload bytes of the current data frame unmasked so far
        self._fragmented = False  # a data message is open: only continuations may follow

    def receive(self, data: bytes) -> tuple[list[bytes], list[tuple[int, bytes]]]:
        """The data frames' payload in ``data``, unmasked, in chunks, and the control frames
        that came whole (opcode and payload); FrameError for a frame the connection must be
        closed over. After a closing frame (:attr:`closed`) everything is ignored."""
        payload: list[bytes] = []
        control: list[tuple[int, bytes]] = []
        if self.closed:
            return payload, control
        buf = self._pending + data if self._pending else data
        at, end = 0, len(buf)
        while at < end and not self.closed:
            if self._left:  # inside a data frame
                n = min(self._left, end - at)
                chunk = buf[at : at + n]
                mask = self._mask
                if self._at & 3:
                    mask = mask[self._at & 3 :] + mask[: self._at & 3]
                payload.append(apply_mask(chunk, mask))
                self._left -= n
                self._at += n
                at += n
                continue
            taken = self._header(buf, at, end, control)
            if taken == 0:
                break  # the rest of the header (or of a control frame) is yet to come
            at += taken
        self._pending = bytes(buf[at:]) if at < end and not self.closed else b""
        return payload, control

    def _header(self, buf: bytes, at: int, end: int, control: list[tuple[int, bytes]]) -> int:
        """Read the frame header at ``at`` (and a control frame's payload): the bytes taken,
        0 while incomplete."""
        if end - at < 2:
            return 0
        first, second = buf[at], buf[at + 1]
        if first & 0x70:
            raise FrameError(PROTOCOL_ERROR, "reserved bits must be 0")
        if not second & 0x80:
            raise FrameError(PROTOCOL_ERROR, "incorrect masking: a client's frames are masked")
        fin, opcode = first & 0x80, first & 0x0F
        sized = _length(buf, at, end, second & 0x7F)
        if sized is None:
            return 0
        length, head = sized
        if end - at < head + 4:
            return 0
        mask = bytes(buf[at + head : at + head + 4])
        head += 4
        if opcode >= CLOSE:
            return self._control(buf, at, end, head, fin, opcode, length, mask, control)
        self._check_data(opcode, length)
        self._fragmented = not fin
        self._left, self._mask, self._at = length, mask, 0
        return head

    def _check_data(self, opcode: int, length: int) -> None:
        if opcode == CONTINUATION:
            if not self._fragmented:
                raise FrameError(PROTOCOL_ERROR, "unexpected continuation frame")
        elif opcode == TEXT:
            raise FrameError(UNSUPPORTED_DATA, "binary frames only: the Postgres protocol")
        elif opcode == BINARY:
            if self._fragmented:
                raise FrameError(PROTOCOL_ERROR, "expected a continuation frame")
        else:
            raise FrameError(PROTOCOL_ERROR, f"invalid opcode {opcode}")
        if length > self.max_frame:
            raise FrameError(MESSAGE_TOO_BIG, f"frame exceeds limit of {self.max_frame} bytes")

    def _control(
        self,
        buf: bytes,
        at: int,
        end: int,
        head: int,
        fin: int,
        opcode: int,
        length: int,
        mask: bytes,
        control: list[tuple[int, bytes]],
    ) -> int:
        if opcode not in (CLOSE, PING, PONG):
            raise FrameError(PROTOCOL_ERROR, f"invalid opcode {opcode}")
        if not fin:
            raise FrameError(PROTOCOL_ERROR, "fragmented control frame")
        if length > _MAX_CONTROL:
            raise FrameError(PROTOCOL_ERROR, "control frame too long")
        if end - at < head + length:
            return 0
        data = apply_mask(buf[at + head : at + head + length], mask)
        if opcode == CLOSE:
            _check_close(data)
            self.closed = True
        control.append((opcode, data))
        return head + length


def _length(buf: bytes, at: int, end: int, short: int) -> tuple[int, int] | None:
    """A frame's payload length and its header's size without the mask (None: incomplete)."""
    if short == 126:
        if end - at < 4:
            return None
        return struct.unpack_from("!H", buf, at + 2)[0], 4
    if short == 127:
        if end - at < 10:
            return None
        (length,) = struct.unpack_from("!Q", buf, at + 2)
        if length >> 63:
            raise FrameError(PROTOCOL_ERROR, "invalid frame length")
        return length, 10
    return short, 2


def _check_close(data: bytes) -> None:
    if len(data) == 1:
        raise FrameError(PROTOCOL_ERROR, "close frame too short")
    if data:
        (code,) = struct.unpack_from("!H", data)
        if code not in _SENDABLE and not 3000 <= code <= 4999:
            raise FrameError(PROTOCOL_ERROR, f"invalid close code {code}")
        try:
            data[2:].decode()
        except UnicodeDecodeError:
            raise FrameError(INVALID_DATA, "invalid UTF-8 in the close reason") from None
