"""Neon's consumption history (``GET /consumption_history/v2/projects``) from the hourly records.

The platform keeps, per branch and hour, what its computes used and its storage over time
(core/usage.py). A query names a range, a granularity and metrics; the range's ends are rounded
down to the granularity (Neon's rule: 15:30 is 15:00 hourly, that day's midnight daily, the
month's first monthly), and the answer has every timeframe of it, oldest first, each with the
metrics asked for. As Neon bounds what it keeps, a range holds at most 168 hours, 60 days or 12
months (406 past that): the bound keeps every answer small.

Metrics, in Neon's names and units where it has them:

- ``compute_unit_seconds``: compute units x seconds the computes ran (a 2 CU compute for one
  second is 2), Neon's ``compute_time_seconds``.
- ``root_branch_bytes_month``, ``child_branch_bytes_month``: the blocks root and child branches'
  data take on disk, over time, in byte-months (byte-hours / 730, an average month).
- ``instant_restore_bytes_month``: the blocks branches' history takes (WAL archive, base states,
  what a restore to a past moment is made from), in byte-months.
- ``snapshot_storage_bytes_month``: the blocks the project's snapshots take (each its
  ``full_size`` from when it was taken until it was deleted), in byte-months; per project only,
  as on Neon.
- Not Neon's: ``active_time_seconds`` (wall seconds the computes ran), ``cpu_seconds`` (the
  CPU time their processes used, by the kernel's accounting) and, with an object store,
  ``archive_storage_bytes_month``: what the branches' history objects take in the bucket
  (sealed: compressed and encrypted), in byte-months.

Network transfer and extra branches are not measured here: asking for them is a 400 that says
so, never a made-up 0.

The older ``GET /consumption_history/projects`` (v1, which Neon's SDKs still call) answers the
same hours in its own shape, each timeframe's figures as fields: ``active_time_seconds``,
``compute_time_seconds`` (compute-unit seconds, as the project's own field), ``written_data_bytes``
(the WAL the computes wrote, as sampled) and ``synthetic_storage_size_bytes`` (0, as Neon now
answers it) always; ``data_storage_bytes_hour`` (data and history, byte-hours),
``logical_size_bytes`` (the largest hourly average within the timeframe) and
``logical_size_bytes_hour`` when asked.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from pgplane.core import clock, ids
from pgplane.core.models import Project
from pgplane.core.usage import HOUR_US, US, HourUsage
from pgplane.errors import BadRequest, NotAcceptable, NotFound
from pgplane.store import Tx

DEFAULT_LIMIT = 10
MAX_LIMIT = 100
MAX_PROJECT_IDS = 100
_MONTH_SECONDS = 730 * 3600  # byte-seconds in a byte-month
_MAX_FRAMES = {"hourly": 168, "daily": 60, "monthly": 12}
_NEON = (
    "compute_unit_seconds",
    "root_branch_bytes_month",
    "child_branch_bytes_month",
    "instant_restore_bytes_month",
    "snapshot_storage_bytes_month",
)
METRICS = (*_NEON, "active_time_seconds", "cpu_seconds", "archive_storage_bytes_month")
# v1's, in its order; the first three when a query names none.
V1_METRICS = (
    "active_time_seconds",
    "compute_time_seconds",
    "written_data_bytes",
    "synthetic_storage_size_bytes",
    "data_storage_bytes_hour",
    "logical_size_bytes",
    "logical_size_bytes_hour",
)
V1_ALWAYS = V1_METRICS[:4]
# Per branch, Neon's four that are measured here (it names network transfer too).
BRANCH_METRICS = _NEON[:4]
BRANCH_DEFAULT_LIMIT = 100
BRANCH_MAX_LIMIT = 1000
_UNMEASURED = (
    "public_network_transfer_bytes",
    "private_network_transfer_bytes",
    "extra_branches_month",
)
# One id, or a comma-separated list of them, as Neon's document states it.
PROJECT_IDS_PATTERN = "^([a-z0-9-]{1,60}(,[a-z0-9-]{1,60}){0,99})?$"
_PROJECT_ID = re.compile("[a-z0-9-]{1,60}")
PERIOD_PLAN = "none"  # no billing plans here: one period, from the project's creation
_PERIODS = uuid.UUID("6d1f4b7e-2c1a-4c55-9a39-2a1e4f0c7b10")  # names each project's period


@dataclass(frozen=True, slots=True)
class Query:
    start_us: int
    end_us: int
    granularity: str
    metrics: tuple[str, ...]
    project_ids: tuple[str, ...] | None
    limit: int
    cursor: str | None


@dataclass(frozen=True, slots=True)
class Frame:
    start_us: int
    end_us: int
    values: dict[str, int]


@dataclass(frozen=True, slots=True)
class ProjectConsumption:
    project_id: str
    period_id: str
    period_start_us: int
    frames: list[Frame] = field(default_factory=list)


def _listed(values: Sequence[str] | None, name: str) -> list[str]:
    """Repeated parameters and comma-separated lists alike, as Neon takes them."""
    # Named twice counts once: the document allows 100 items, each a comma-separated list.
    out = list(dict.fromkeys(v.strip() for value in values or () for v in value.split(",")))
    out = [v for v in out if v]
    if len(out) > MAX_PROJECT_IDS:
        raise BadRequest(f"{name}: at most {MAX_PROJECT_IDS} values")
    return out


_EARLIEST = clock.parse_us("2000-01-01T00:00:00Z")
_LATEST = clock.parse_us("9000-01-01T00:00:00Z")


def _time(value: str, name: str) -> int:
    try:
        us = clock.parse_us(value)
    except ValueError:
        raise BadRequest(f"{name} must be an RFC 3339 date-time, as 2024-03-15T15:00:00Z") from None
    if not _EARLIEST <= us < _LATEST:
        raise BadRequest(f"{name} must be between the years 2000 and 9000")
    return us


def floor(us: int, granularity: str) -> int:
    """The start of the timeframe ``us`` falls in."""
    if granularity == "hourly":
        return us // HOUR_US * HOUR_US
    at = datetime.fromtimestamp(us // US, UTC)
    at = at.replace(hour=0, minute=0, second=0, microsecond=0)
    if granularity == "monthly":
        at = at.replace(day=1)
    return int(at.timestamp()) * US


def following(us: int, granularity: str) -> int:
    """The start of the timeframe after the one starting at ``us``."""
    if granularity == "hourly":
        return us + HOUR_US
    if granularity == "daily":
        return us + 24 * HOUR_US
    at = datetime.fromtimestamp(us // US, UTC)
    year, month = (at.year + 1, 1) if at.month == 12 else (at.year, at.month + 1)
    return int(at.replace(year=year, month=month).timestamp()) * US


def parse(
    *,
    from_: str,
    to: str,
    granularity: str,
    metrics: Sequence[str] | None,
    project_ids: Sequence[str] | None,
    limit: int | None,
    cursor: str | None,
    org_id: str | None,
    allowed: Sequence[str] = METRICS,
    default_limit: int = DEFAULT_LIMIT,
    max_limit: int = MAX_LIMIT,
) -> Query:
    """The query as asked, checked: every refusal says what to change."""
    if org_id is not None:
        # Projects here belong to accounts: no organization exists that one could be in.
        raise NotFound(f"organization {org_id!r} not found: projects here belong to accounts")
    if granularity not in _MAX_FRAMES:
        raise BadRequest("granularity must be one of hourly, daily, monthly")
    names = _listed(metrics, "metrics")
    if not names:
        raise BadRequest(f"metrics is required: any of {', '.join(allowed)}")
    unmeasured = [n for n in names if n in _UNMEASURED]
    if unmeasured:
        raise BadRequest(f"metrics not measured on this platform: {', '.join(unmeasured)}")
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise BadRequest(f"unknown metrics {', '.join(unknown)}: any of {', '.join(allowed)}")
    start = floor(_time(from_, "from"), granularity)
    end = floor(_time(to, "to"), granularity)
    if end <= start:
        raise NotAcceptable(f"to must be at least one {granularity} timeframe after from")
    count, at = 0, start
    while at < end:
        at, count = following(at, granularity), count + 1
        if count > _MAX_FRAMES[granularity]:
            raise NotAcceptable(
                f"the range from {clock.format_s(start)} to {clock.format_s(end)} holds more than"
                f" {_MAX_FRAMES[granularity]} {granularity} timeframes: narrow it or choose"
                " another granularity"
            )
    size = default_limit if limit is None else limit
    if not 1 <= size <= max_limit:
        raise BadRequest(f"limit must be between 1 and {max_limit}")
    wanted = _listed(project_ids, "project_ids")
    for project_id in wanted:
        # Of the form of an id: one that names nothing is left out as another account's is.
        if _PROJECT_ID.fullmatch(project_id) is None:
            raise BadRequest(f"project_ids: {project_id[:64]!r} is not a project id")
    return Query(
        start_us=start,
        end_us=end,
        granularity=granularity,
        metrics=tuple(dict.fromkeys(names)),
        project_ids=tuple(dict.fromkeys(wanted)) if project_ids else None,
        limit=size,
        cursor=cursor,
    )


def _values(hours: Sequence[tuple[HourUsage, bool]], metrics: Sequence[str]) -> dict[str, int]:
    cu = cpu = active = root = child = history = archived = written = logical = 0
    logical_by_hour: dict[int, int] = {}
    for h, is_root in hours:
        cu, cpu, active = cu + h.cu_us, cpu + h.cpu_us, active + h.active_us
        if is_root:
            root += h.data_byte_s
        else:
            child += h.data_byte_s
        history += h.history_byte_s
        archived += h.archived_byte_s
        written += h.written_bytes
        logical += h.logical_byte_s
        logical_by_hour[h.hour] = logical_by_hour.get(h.hour, 0) + h.logical_byte_s
    every = {
        # v1's (the hour's byte-seconds / 3600: byte-hours, or an hour's average size).
        "compute_time_seconds": cu // US,
        "written_data_bytes": written,
        "synthetic_storage_size_bytes": 0,
        "data_storage_bytes_hour": (root + child + history) // 3600,
        "logical_size_bytes": max(logical_by_hour.values(), default=0) // 3600,
        "logical_size_bytes_hour": logical // 3600,
        "compute_unit_seconds": cu // US,
        "root_branch_bytes_month": root // _MONTH_SECONDS,
        "child_branch_bytes_month": child // _MONTH_SECONDS,
        "instant_restore_bytes_month": history // _MONTH_SECONDS,
        "snapshot_storage_bytes_month": 0,
        "active_time_seconds": active // US,
        "cpu_seconds": cpu // US,
        "archive_storage_bytes_month": archived // _MONTH_SECONDS,
    }
    return {m: every[m] for m in metrics}


def v1_metrics(metrics: Sequence[str] | None, *, include_v1_metrics: bool) -> list[str]:
    """What a v1 query answers: its four fields always, and the others it names (or, without
    ``metrics``, what the deprecated ``include_v1_metrics`` adds)."""
    named = _listed(metrics, "metrics")
    unknown = [n for n in named if n not in V1_METRICS]
    if unknown:
        raise BadRequest(f"unknown metrics {', '.join(unknown)}: any of {', '.join(V1_METRICS)}")
    if not named and include_v1_metrics:
        named = ["data_storage_bytes_hour"]
    return list(dict.fromkeys([*V1_ALWAYS, *named]))


def _held(held: Sequence[tuple[int, int, int]], start: int, end: int) -> int:
    """Byte-seconds the snapshots ``held`` took within ``[start, end)`` (us)."""
    total = 0
    for size, since, until in held:
        overlap = min(end, until) - max(start, since)
        if overlap > 0:
            total += size * overlap // US
    return total


async def _projects(tx: Tx, account_id: str, query: Query) -> tuple[list[Project], str | None]:
    """The page of the account's projects asked for, newest first, and the next cursor."""
    if query.project_ids is None:
        if query.cursor is not None and not (
            ids.is_valid_id(query.cursor)
            and await tx.project_exists(account_id=account_id, project_id=query.cursor)
        ):
            raise BadRequest("cursor must be the pagination.cursor of a previous page")
        page = await tx.list_projects(
            account_id=account_id, after_id=query.cursor, limit=query.limit
        )
    else:
        # Another account's project is left out exactly as one that does not exist.
        found = [
            p
            for p in [
                await tx.get_project(account_id=account_id, project_id=project_id)
                for project_id in query.project_ids
            ]
            if p is not None
        ]
        found.sort(key=lambda p: (p.created_at, p.id), reverse=True)
        if query.cursor is not None:
            at = [i for i, p in enumerate(found) if p.id == query.cursor]
            if not at:
                raise BadRequest("cursor must be the pagination.cursor of a previous page")
            found = found[at[0] + 1 :]
        page = found[: query.limit]
    return page, page[-1].id if len(page) == query.limit else None


async def per_project(
    tx: Tx, *, account_id: str, query: Query
) -> tuple[list[ProjectConsumption], str | None]:
    """Each project of the page with its timeframes; the cursor of the next page, if any."""
    page, cursor = await _projects(tx, account_id, query)
    out = []
    for project in page:
        hours = await _hours(tx, project.id, query)
        held = [
            (s.full_size, s.created_at, s.deleted_at or clock.now_us())
            for s in await tx.list_snapshots(project.id, include_deleted=True)
            if s.full_size
        ]
        frames = _frames(hours, query, project.created_at, held)
        out.append(ProjectConsumption(project.id, _period(project), project.created_at, frames))
    return out, cursor


def _period(project: Project) -> str:
    return str(uuid.uuid5(_PERIODS, project.id))


async def _hours(tx: Tx, project_id: str, query: Query) -> list[tuple[HourUsage, bool]]:
    return await tx.usage_hours(
        project_id, from_hour=query.start_us // US, to_hour=query.end_us // US
    )


def _frames(
    hours: Sequence[tuple[HourUsage, bool]],
    query: Query,
    created_us: int,
    held: Sequence[tuple[int, int, int]] = (),
) -> list[Frame]:
    """The query's timeframes, oldest first, from when the object was made, with ``hours``
    (in order) summed into each, and the snapshots ``held`` (bytes, from, to: us) over each."""
    frames, at, i = [], query.start_us, 0
    while at < query.end_us:
        end = following(at, query.granularity)
        inside = []
        while i < len(hours) and hours[i][0].hour * US < end:
            inside.append(hours[i])
            i += 1
        if end > floor(created_us, "hourly"):  # nothing before it was made
            values = _values(inside, query.metrics)
            if "snapshot_storage_bytes_month" in values:
                values["snapshot_storage_bytes_month"] = _held(held, at, end) // _MONTH_SECONDS
            frames.append(Frame(at, end, values))
        at = end
    return frames


@dataclass(frozen=True, slots=True)
class BranchConsumption:
    project_id: str
    branch_id: str
    period_id: str
    period_start_us: int
    frames: list[Frame]


async def per_branch(
    tx: Tx, *, account_id: str, query: Query
) -> tuple[list[BranchConsumption], str | None]:
    """Each branch of the projects asked for (its deleted ones too, while their records last),
    by project id then branch id; the cursor of the next page, if any."""
    if not query.project_ids:
        raise BadRequest("project_ids is required: 1 to 100 projects")
    found = [
        p
        for p in [
            await tx.get_project(account_id=account_id, project_id=project_id)
            for project_id in query.project_ids
        ]
        if p is not None  # another account's is left out as one that does not exist
    ]
    rows: list[tuple[str, BranchConsumption]] = []
    for project in sorted(found, key=lambda p: p.id):
        by_branch: dict[str, list[tuple[HourUsage, bool]]] = {}
        for hour in await _hours(tx, project.id, query):
            by_branch.setdefault(hour[0].branch_id, []).append(hour)
        live = {b.id: b.created_at for b in await tx.list_branches(project.id)}
        for branch_id in sorted(set(by_branch) | set(live)):
            made = live.get(branch_id, project.created_at)
            frames = _frames(by_branch.get(branch_id, []), query, made)
            key = f"{project.id}/{branch_id}"
            rows.append(
                (key, BranchConsumption(project.id, branch_id, _period(project), made, frames))
            )
    start = 0
    if query.cursor is not None:
        keys = [key for key, _ in rows]
        if query.cursor not in keys:
            raise BadRequest("cursor must be the pagination.cursor of a previous page")
        start = keys.index(query.cursor) + 1
    page = rows[start : start + query.limit]
    more = start + query.limit < len(rows)
    return [b for _, b in page], page[-1][0] if more and page else None
