"""A compute connection's messages as a request reads them: every whole one that has arrived
is taken without waiting, and the connection is awaited only when none is.

A request's answer comes in a few reads but a dozen messages (the reset's, the request's, the
rows): parsed here from what arrived, they cost a slice each, where reading each one from the
connection on its own costs two waits. Bounded as the connection's own reads are: a message
longer than ``limit`` is a :class:`~pgplane.proxy.framing.FrameError` as soon as its header is
in, and no more is read than the message being completed asks.
"""

from __future__ import annotations

from pgplane.proxy.framing import HEADER, payload_length
from pgplane.proxy.pipe import Closed, Side

_READ = 64 * 1024


class Frames:
    def __init__(self, side: Side, *, limit: int) -> None:
        self._side = side
        self._limit = limit
        self._data = b""
        self._at = 0  # where the next message begins in ``_data``

    def pending(self) -> bool:
        """Whether bytes past the last message taken have arrived (read, not yet taken)."""
        return self._at < len(self._data)

    def take(self) -> tuple[bytes, bytes] | None:
        """The next message (its type byte and payload) if it has arrived whole, else None."""
        data, at = self._data, self._at
        if len(data) - at < HEADER:
            return None
        end = at + HEADER + payload_length(data[at : at + HEADER], limit=self._limit)
        if end > len(data):
            return None
        self._at = end
        return data[at : at + 1], data[at + HEADER : end]

    async def fill(self) -> None:
        """Read on: the rest of the message begun, in as many reads as it takes and joined
        once (a large row costs one copy, not one per read); else what has come (Closed at
        the connection's end)."""
        data, at = self._data, self._at
        left = len(data) - at
        if left < HEADER:
            more = await self._side.read_some(_READ)
            if not more:
                raise Closed
            self._data, self._at = data[at:] + more, 0
            return
        missing = HEADER + payload_length(data[at : at + HEADER], limit=self._limit) - left
        parts = [data[at:]]
        while missing > 0:
            more = await self._side.read_some(max(missing, _READ))
            if not more:
                raise Closed
            parts.append(more)
            missing -= len(more)
        self._data, self._at = b"".join(parts), 0

    async def next(self) -> tuple[bytes, bytes]:
        """The next message, waiting for it."""
        while (message := self.take()) is None:
            await self.fill()
        return message
