"""Message framing of the Postgres protocol as the proxy meets it: pure functions over bytes.

Every frame after the startup is a type byte and a 4-byte length that counts itself. The proxy
reads frames only while it logs in; after that it notices the backend's cancel key on the way
past (:class:`KeySniffer`) and otherwise forwards bytes unparsed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

HEADER = 5
# Larger frames are refused while logging in: Postgres' own limit for a password message is this
# (PG_MAX_AUTH_TOKEN_LENGTH, 65535), and a compute's replies before ReadyForQuery are parameter
# statuses, a cancel key and perhaps a notice. It stays below what a side buffers before it stops
# reading (pipe.HANDSHAKE_BUFFER), so a frame being read can always arrive whole.
MAX_AUTH_FRAME = 1 << 16


class FrameError(Exception):
    """A frame whose length is impossible or too large for where it arrived."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!I", len(payload) + 4) + payload


def payload_length(header: bytes, *, limit: int) -> int:
    """The length of the payload that follows a 5-byte header; FrameError past ``limit``."""
    length = int.from_bytes(header[1:HEADER], "big")
    if length < 4 or length - 4 > limit:
        raise FrameError(f"invalid message length {length}")
    return length - 4


class KeySniffer:
    """Reads message frames of the backend's first replies until its BackendKeyData.

    Called with each chunk the compute sends; returns True once it is done (the key found, or
    the session ready or failed without one), after which it is not called again.
    """

    def __init__(self, found: Callable[[int, bytes], None]) -> None:
        self._buffer = b""
        self._found = found

    def __call__(self, data: bytes) -> bool:
        self._buffer += data
        while len(self._buffer) >= HEADER:
            kind = self._buffer[:1]
            (length,) = struct.unpack("!I", self._buffer[1:HEADER])
            if kind == b"K":
                if len(self._buffer) < 1 + length:
                    return False
                (pid,) = struct.unpack("!I", self._buffer[HEADER : HEADER + 4])
                self._found(pid, self._buffer[HEADER + 4 : 1 + length])
                return True
            if kind in (b"Z", b"E") or length > 1 << 20:
                return True  # ready (or failed) without a key: nothing to cancel
            if len(self._buffer) < 1 + length:
                return False
            self._buffer = self._buffer[1 + length :]
        return False
