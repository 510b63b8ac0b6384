"""How the console says a time to come: what is left, in its largest whole unit."""

from __future__ import annotations

import pytest

from pgplane.console import pages
from pgplane.core import clock

_S = 1_000_000


@pytest.mark.parametrize(
    ("seconds", "said"),
    [
        (86_400 * 7, "in 7 days"),
        (86_400, "in 1 day"),
        (86_399, "in 23 hours"),
        (3_600, "in 1 hour"),
        (119, "in 1 minute"),
        (59, "in 59 seconds"),
        (0, "now"),
        (-3_600, "now"),
    ],
)
def test_until_says_what_is_left(monkeypatch: pytest.MonkeyPatch, seconds: int, said: str) -> None:
    now = clock.now_us()
    monkeypatch.setattr(clock, "now_us", lambda: now)
    assert pages.until(now + seconds * _S) == said


def test_until_of_no_time_is_nothing() -> None:
    assert pages.until(None) == ""
