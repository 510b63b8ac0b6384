"""Points of a branch's history, as clients name them, and whether the history holds them.

A point is an LSN (``16/B374D848``, as Postgres prints it) or an RFC 3339 time. It must lie
within the project's window (``history_retention_seconds`` back from now, 0 keeping none), not in
the future, not before the branch existed, and within what the branch's history holds now (from
its first base state to its head, as the data plane reports: :class:`HistoryBounds`). Each
refusal is a 400 that says which, and nothing is created.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Protocol

from pgplane.compute.driver import HistoryBounds, Point
from pgplane.core import clock
from pgplane.core.models import Branch, Project
from pgplane.errors import BadRequest

__all__ = [  # HistoryBounds too: the routes name what a lookup answers through this module
    "LSN_PATTERN",
    "TIME_PATTERN",
    "HistoryBounds",
    "HistoryLookup",
    "NamedPoint",
    "check",
    "format_lsn",
    "parse_lsn",
    "parse_point",
    "parse_time",
    "unknown_history",
]

# What the document says of points (the checks below say the same in their own words).
LSN_PATTERN = r"^(?!0{1,8}/0{1,8}$)[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$"
_DATE_TIME = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
TIME_PATTERN = rf"^{_DATE_TIME}([Zz]|[+-][0-9]{{2}}:[0-9]{{2}})$"
_LSN = re.compile(r"([0-9A-Fa-f]{1,8})/([0-9A-Fa-f]{1,8})")
_US = 1_000_000


class HistoryLookup(Protocol):
    """What of a branch's history the data plane holds now (the driver's history_bounds)."""

    async def __call__(
        self, *, project_id: str, branch_id: str, pg_version: int
    ) -> HistoryBounds: ...


async def unknown_history(*, project_id: str, branch_id: str, pg_version: int) -> HistoryBounds:
    """A lookup that knows nothing: only the window and the clock are checked."""
    return HistoryBounds()


@dataclass(frozen=True, slots=True)
class NamedPoint:
    """A point as the request named it (``field`` says which field, for messages)."""

    point: Point
    field: str
    text: str


def parse_point(
    *, lsn: str | None, timestamp: str | None, lsn_field: str, time_field: str
) -> NamedPoint | None:
    if lsn is not None and timestamp is not None:
        raise BadRequest(f"give {lsn_field} or {time_field}, not both")
    if lsn is not None:
        return NamedPoint(Point(lsn=parse_lsn(lsn, lsn_field)), lsn_field, lsn)
    if timestamp is not None:
        return NamedPoint(Point(time_us=parse_time(timestamp, time_field)), time_field, timestamp)
    return None


def parse_lsn(text: str, field: str) -> int:
    match = _LSN.fullmatch(text.strip())
    if match is None:
        raise BadRequest(f"{field} must be an LSN such as 0/1A2B3C4D, not {text!r}")
    lsn = (int(match[1], 16) << 32) | int(match[2], 16)
    if lsn == 0:
        raise BadRequest(f"{field} 0/0 is no LSN of any branch")
    return lsn


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def parse_time(text: str, field: str) -> int:
    """An RFC 3339 time (``TIME_PATTERN``: the document says the same), in epoch us."""
    stripped = text.strip()
    if re.fullmatch(_DATE_TIME, stripped):
        raise BadRequest(f"{field} must say its time zone (such as Z), not {text!r}")
    refused = BadRequest(
        f"{field} must be an RFC 3339 time such as 2024-02-26T12:00:00Z, not {text!r}"
    )
    if re.fullmatch(TIME_PATTERN, stripped) is None:
        raise refused
    try:  # a date or time out of range (month 13, hour 25) matches the pattern
        moment = datetime.datetime.fromisoformat(stripped.upper().replace("Z", "+00:00"))
    except ValueError:
        raise refused from None
    return _exact_us(moment)


def _exact_us(moment: datetime.datetime) -> int:
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
    delta = moment - epoch
    return (delta.days * 86400 + delta.seconds) * _US + delta.microseconds


def check(named: NamedPoint, *, project: Project, branch: Branch, bounds: HistoryBounds) -> None:
    """Refuse a point the branch's history does not hold, saying why."""
    retention = project.history_retention_seconds
    what = f"{named.field} {named.text}"
    if retention <= 0:
        raise BadRequest(f"{what}: the project keeps no history (history_retention_seconds is 0)")
    now = clock.now_us()
    window_start = now - retention * _US
    point = named.point
    if point.time_us is not None:
        t = point.time_us
        if t > now:
            raise BadRequest(f"{what} is in the future")
        if t < branch.created_at:
            raise BadRequest(
                f"{what} is before branch {branch.id} existed (it was created at"
                f" {clock.format_us(branch.created_at)})"
            )
        if t < window_start:
            raise BadRequest(
                f"{what} is outside the project's history window of {retention} seconds"
                f" (it starts at {clock.format_us(window_start)})"
            )
        if bounds.start_time_us is not None and t < bounds.start_time_us:
            raise BadRequest(
                f"{what} is before the history of branch {branch.id} starts"
                f" ({clock.format_us(bounds.start_time_us)})"
            )
    if point.lsn is not None:
        if bounds.head_lsn is not None and point.lsn > bounds.head_lsn:
            raise BadRequest(
                f"{what}: branch {branch.id} never had this LSN (its latest is"
                f" {format_lsn(bounds.head_lsn)})"
            )
        if bounds.start_lsn is not None and point.lsn < bounds.start_lsn:
            raise BadRequest(
                f"{what} is before the history of branch {branch.id} starts (LSN"
                f" {format_lsn(bounds.start_lsn)}), or outside the project's history window"
            )
    if bounds.start_lsn is None and bounds.head_lsn is not None:
        raise BadRequest(
            f"{what}: branch {branch.id} has no history yet (its first base state is being"
            " taken); try again in a moment"
        )
