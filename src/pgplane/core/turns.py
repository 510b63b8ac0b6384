"""Turns per key: at most so many at once for each key (a project, a tenant), the rest waiting
theirs, first come first. A key nobody holds or waits for is forgotten, so memory follows the
keys in use, not every key ever seen."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager


class Turns:
    def __init__(self, per_key: int) -> None:
        self._per_key = per_key
        self._keys: dict[Hashable, tuple[int, asyncio.Semaphore]] = {}  # holders and waiters

    @asynccontextmanager
    async def turn(self, key: Hashable) -> AsyncIterator[None]:
        users, turns = self._keys.get(key) or (0, asyncio.Semaphore(self._per_key))
        self._keys[key] = (users + 1, turns)
        try:
            async with turns:
                yield
        finally:
            users, _ = self._keys[key]
            if users == 1:
                del self._keys[key]
            else:
                self._keys[key] = (users - 1, turns)

    def __len__(self) -> int:
        return len(self._keys)
