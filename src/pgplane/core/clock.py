"""Time as the platform stores and shows it.

Timestamps are stored as integer microseconds since the Unix epoch (exact, sortable, unique per
project for operations) and shown as ISO 8601 UTC strings ending in ``Z``.
"""

from __future__ import annotations

import functools
import re
import time

# RFC 3339 date-time (what the API document calls ``format: date-time``), and a space for the T.
# ASCII digits only, and no newline after the end (which $ would let through).
_ISO = re.compile(
    r"^(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d+))?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))\Z",
    re.ASCII,
)
_DAYS_IN_MONTH = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def now_us() -> int:
    """Current time in microseconds since the epoch."""
    return time.time_ns() // 1000


@functools.lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # Cached: responses format many timestamps that share their second, and formatting a
    # datetime was a fifth of the cost of listing operations.
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))


@functools.lru_cache(maxsize=8192)
def format_us(us: int) -> str:
    """Microsecond timestamp as ``2025-01-16T21:02:04.214837Z`` (always six fractional digits).

    Cached too: a page of operations formats 21 of them, the same ones each time it is polled,
    and formatting them was a tenth of the page's cost."""
    seconds, micros = divmod(us, 1_000_000)
    return f"{_second(seconds)}.{micros:06d}Z"


def format_s(us: int) -> str:
    """Timestamp with second precision, as Neon shows most object timestamps."""
    return _second(us // 1_000_000) + "Z"


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days since 1970-01-01 in the proleptic Gregorian calendar, for any year from 0 (a
    datetime stops at year 1)."""
    year -= month <= 2
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def parse_us(text: str) -> int:
    """Parse an RFC 3339 timestamp (as :func:`format_us` produces, or with any UTC offset) to
    microseconds since the epoch.

    Raises ValueError for anything else; fractions beyond microseconds are truncated, and a leap
    second is the last microsecond of its minute.
    """
    m = _ISO.match(text)
    if m is None:
        raise ValueError(f"not an RFC 3339 timestamp: {text!r}")
    year, month, day, hour, minute, second = (int(m.group(i)) for i in range(1, 7))
    frac = int((m.group(7) or "").ljust(6, "0")[:6])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= month <= 12:
        raise ValueError(f"month out of range in timestamp {text!r}")
    if not 1 <= day <= _DAYS_IN_MONTH[month - 1] + (month == 2 and leap):
        raise ValueError(f"day out of range in timestamp {text!r}")
    if hour > 23 or minute > 59 or second > 60:
        raise ValueError(f"time of day out of range in timestamp {text!r}")
    if second == 60:
        second, frac = 59, 999_999
    offset = 0
    if m.group(9):
        off_hours, off_minutes = int(m.group(10)), int(m.group(11))
        if off_hours > 23 or off_minutes > 59:
            raise ValueError(f"UTC offset out of range in timestamp {text!r}")
        offset = (off_hours * 60 + off_minutes) * (1 if m.group(9) == "+" else -1)
    seconds = _days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second
    return (seconds - offset * 60) * 1_000_000 + frac
