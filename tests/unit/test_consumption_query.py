"""The consumption history's query: rounding, bounds and refusals (no server needed)."""

from __future__ import annotations

import pytest

from pgplane.core import clock
from pgplane.errors import BadRequest, NotAcceptable, NotFound
from pgplane.services.consumption import Query, floor, following, parse


def _parse(**change: object) -> Query:
    args: dict[str, object] = {
        "from_": "2026-03-15T15:30:00Z",
        "to": "2026-03-16T15:30:00Z",
        "granularity": "hourly",
        "metrics": ["compute_unit_seconds"],
        "project_ids": None,
        "limit": None,
        "cursor": None,
        "org_id": None,
    }
    return parse(**{**args, **change})  # type: ignore[arg-type]


def test_ends_are_rounded_down_to_the_granularity() -> None:
    q = _parse()
    assert clock.format_s(q.start_us) == "2026-03-15T15:00:00Z"
    assert clock.format_s(q.end_us) == "2026-03-16T15:00:00Z"
    q = _parse(granularity="daily", to="2026-03-18T01:00:00+02:00")
    assert clock.format_s(q.start_us) == "2026-03-15T00:00:00Z"
    assert clock.format_s(q.end_us) == "2026-03-17T00:00:00Z"
    q = _parse(granularity="monthly", from_="2026-01-31T10:00:00Z", to="2026-12-01T00:00:00Z")
    assert clock.format_s(q.start_us) == "2026-01-01T00:00:00Z"
    months = clock.parse_us("2026-12-01T00:00:00Z")
    assert following(floor(months, "monthly"), "monthly") == clock.parse_us("2027-01-01T00:00:00Z")


def test_lists_come_repeated_or_comma_separated() -> None:
    q = _parse(metrics=["compute_unit_seconds,cpu_seconds", "active_time_seconds"])
    assert q.metrics == ("compute_unit_seconds", "cpu_seconds", "active_time_seconds")
    q = _parse(project_ids=["a-b-12345678,c-d-12345678", "a-b-12345678"])
    assert q.project_ids == ("a-b-12345678", "c-d-12345678")


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"granularity": "weekly"}, BadRequest),
        ({"metrics": []}, BadRequest),
        ({"metrics": ["extra_branches_month"]}, BadRequest),
        ({"from_": "0001-01-01T00:00:00Z"}, BadRequest),
        ({"to": "9999-12-31T23:59:59Z"}, BadRequest),
        ({"to": "2026-03-15T15:59:00Z"}, NotAcceptable),
        ({"granularity": "daily", "to": "2026-06-15T00:00:00Z"}, NotAcceptable),
        ({"org_id": "org-x"}, NotFound),
        ({"limit": 101}, BadRequest),
        ({"project_ids": ["../etc"]}, BadRequest),
        # 101 different ones (one named twice counts once).
        ({"project_ids": [",".join(f"a-b-{i:08d}" for i in range(101))]}, BadRequest),
    ],
)
def test_refusals(change: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        _parse(**change)


def test_a_value_named_twice_counts_once() -> None:
    q = _parse(metrics=["compute_unit_seconds,compute_unit_seconds"] * 150)
    assert q.metrics == ("compute_unit_seconds",)
