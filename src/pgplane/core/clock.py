"""Time as the platform stores and shows it.

Timestamps are stored as integer microseconds since the Unix epoch (exact, sortable, unique per
project for operations) and shown as ISO 8601 UTC strings ending in ``Z``.
"""

from __future__ import annotations

import functools
import re
import time
from datetime import UTC, datetime

_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?(Z|z|[+-]00:?00)$"
)


def now_us() -> int:
    """Current time in microseconds since the epoch."""
    return time.time_ns() // 1000


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # Cached: responses format many timestamps that share their second, and formatting a
    # datetime was a fifth of the cost of listing operations.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


def format_us(us: int) -> str:
    """Microsecond timestamp as ``2025-01-16T21:02:04.214837Z`` (always six fractional digits)."""
    seconds, micros = divmod(us, 1_000_000)
    return f"{_second(seconds)}.{micros:06d}Z"


def format_s(us: int) -> str:
    """Timestamp with second precision, as Neon shows most object timestamps."""
    return _second(us // 1_000_000) + "Z"


def parse_us(text: str) -> int:
    """Parse an ISO 8601 UTC timestamp (as produced by :func:`format_us`) to microseconds.

    Raises ValueError for anything that is not a UTC timestamp; fractions beyond microseconds are
    truncated.
    """
    m = _ISO.match(text)
    if m is None:
        raise ValueError(f"not an ISO 8601 UTC timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = (m.group(7) or "").ljust(6, "0")[:6]
    dt = datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    return int(dt.timestamp()) * 1_000_000 + int(frac)
