"""Backup schedule slots: the latest moment of each entry at or before now, named once."""

from __future__ import annotations

import pytest

from pgplane.core import clock
from pgplane.errors import BadRequest
from pgplane.services.backups import Entry, entry, latest_slot


def _at(text: str) -> int:
    return clock.parse_us(text)


def test_a_daily_slot_is_todays_once_its_hour_struck_else_yesterdays() -> None:
    e = Entry("daily", hour=3)
    assert latest_slot(e, _at("2026-11-25T03:00:00Z")) == (
        "daily:2026-11-25T03:00:00Z",
        _at("2026-11-25T03:00:00Z"),
    )
    assert latest_slot(e, _at("2026-11-25T02:59:59Z"))[0] == "daily:2026-11-24T03:00:00Z"


def test_a_weekly_slot_falls_on_its_weekday() -> None:
    e = Entry("weekly", hour=2, day=1)  # Mondays; 2026-11-25 is a Wednesday
    assert latest_slot(e, _at("2026-11-25T12:00:00Z"))[0] == "weekly:2026-11-23T02:00:00Z"
    assert latest_slot(e, _at("2026-11-23T01:00:00Z"))[0] == "weekly:2026-11-16T02:00:00Z"


def test_a_monthly_slot_on_a_day_a_month_lacks_is_its_last_day() -> None:
    e = Entry("monthly", hour=0, day=31)
    assert latest_slot(e, _at("2026-11-25T00:00:00Z"))[0] == "monthly:2026-10-31T00:00:00Z"
    assert latest_slot(e, _at("2026-12-01T00:00:00Z"))[0] == "monthly:2026-11-30T00:00:00Z"
    assert latest_slot(e, _at("2026-01-15T00:00:00Z"))[0] == "monthly:2025-12-31T00:00:00Z"


@pytest.mark.parametrize(
    ("args", "field"),
    [(("daily", None, 3, None), "schedule.day"), (("hourly", None, None, None), "frequency")],
)
def test_an_entry_that_cannot_do_what_it_says_is_refused(
    args: tuple[str, int | None, int | None, int | None], field: str
) -> None:
    with pytest.raises(BadRequest, match=field):
        entry(*args)


def test_defaults_are_neons() -> None:
    assert entry("daily", None, None, None) == Entry(
        "daily", hour=0, day=None, retention_seconds=3_024_000
    )
    assert entry("weekly", 2, None, 3600) == Entry("weekly", hour=2, day=1, retention_seconds=3600)
