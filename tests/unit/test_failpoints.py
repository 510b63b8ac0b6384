"""Failpoint specs: a bare name waits to be killed, ``sleep(MS)`` pauses, ``raise`` raises,
``N*`` counts."""

from __future__ import annotations

import asyncio

import pytest

from pgplane import failpoints


def test_specs_parse_and_bad_ones_are_refused() -> None:
    armed = failpoints.parse(" before:start_compute , create_branch:copied=2*sleep(1500),a=wait,")
    assert {n: (a.sleep_ms, a.times) for n, a in armed.items()} == {
        "before:start_compute": (None, None),
        "create_branch:copied": (1500, 2),
        "a": (None, None),
    }
    assert failpoints.parse("") == {}
    for bad in ("x=sleep", "x=sleep(1s)", "x=0*wait", "x=panic", "x=2*"):
        with pytest.raises(ValueError, match="PGPLANE_FAILPOINTS"):
            failpoints.parse(bad)


async def test_a_counted_pause_acts_that_many_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "_armed", failpoints.parse("p=2*sleep(1),w"))
    await failpoints.reached("p")
    await failpoints.reached("p")
    assert "p" not in failpoints._armed  # off after its two times
    await failpoints.reached("p")
    await failpoints.reached("not-armed")
    with pytest.raises(TimeoutError):  # a bare name never returns: it waits to be killed
        await asyncio.wait_for(failpoints.reached("w"), 0.05)


async def test_a_raising_failpoint_raises_then_goes_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(failpoints, "_armed", failpoints.parse("always=raise,twice=2*raise"))
    for _ in range(3):
        with pytest.raises(failpoints.FailpointError, match="failpoint always raised"):
            await failpoints.reached("always")
    for _ in range(2):
        with pytest.raises(failpoints.FailpointError):
            await failpoints.reached("twice")
    await failpoints.reached("twice")  # off after its two times
