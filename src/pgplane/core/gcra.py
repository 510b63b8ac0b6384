"""GCRA (the generic cell rate algorithm): a token bucket kept as one number per key.

The number is the moment the key's bucket will be full again, in integer nanoseconds so that
``burst`` requests at one instant fit exactly. Pure and single-threaded: callers use it from the
event loop, between awaits. The API's rate limits and the proxy's wrong-password throttle count
with it.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Hashable

_SECOND = 1_000_000_000
# How often keys whose buckets are full again are forgotten, so that memory follows the keys of the
# last minute or so, not every key ever seen.
_SWEEP_EVERY = 60 * _SECOND


class Limit:
    """``burst`` requests at once, refilled at ``per_second``, for each key on its own."""

    __slots__ = ("_full_at", "_interval", "_next_sweep", "_tolerance")

    def __init__(self, *, per_second: float, burst: int) -> None:
        self._interval = max(1, round(_SECOND / per_second))  # what one request costs
        self._tolerance = (burst - 1) * self._interval  # how far ahead of now full_at may be
        self._full_at: dict[Hashable, int] = {}
        self._next_sweep = 0

    def wait(self, key: Hashable, now: int) -> int:
        """Nanoseconds until ``key`` may make a request; 0 if it may now."""
        full_at = self._full_at.get(key)
        if full_at is None:
            return 0
        return max(0, full_at - self._tolerance - now)

    def take(self, key: Hashable, now: int) -> None:
        """Count a request of ``key``, which ``wait`` allowed."""
        full_at = self._full_at.get(key, now)
        self._full_at[key] = max(full_at, now) + self._interval
        if now >= self._next_sweep:
            self._full_at = {k: t for k, t in self._full_at.items() if t > now}
            self._next_sweep = now + _SWEEP_EVERY

    def __len__(self) -> int:
        return len(self._full_at)


@functools.lru_cache(maxsize=4096)
def address_key(host: str) -> str:
    """What failures are counted by: an IPv4 address, or an IPv6 address's /64.

    A host is usually given a whole IPv6 /64: counting single addresses would let it rotate
    through them and never be throttled.
    """
    if ":" not in host:
        return host
    try:
        network = ipaddress.IPv6Network((host, 64), strict=False)
    except ValueError:
        return host
    return str(network)
