"""Warnings a client can cause are said once per cause a minute, the rest counted."""

from __future__ import annotations

import logging

import pytest

from pgplane.telemetry import sparse
from pgplane.telemetry.sparse import Sparse


def test_a_cause_is_said_once_a_minute_and_what_was_left_out_counted(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(sparse.time, "monotonic", lambda: now[0])
    say = Sparse(logging.getLogger("pgplane.test"))
    with caplog.at_level(logging.WARNING):
        for _ in range(500):
            say.warning("ep-a", "endpoint %s: could not read role", "ep-a")
        say.warning("ep-b", "endpoint %s: could not read role", "ep-b")  # another cause
        now[0] += 61
        say.warning("ep-a", "endpoint %s: could not read role", "ep-a")
    assert [r.getMessage() for r in caplog.records] == [
        "endpoint ep-a: could not read role",
        "endpoint ep-b: could not read role",
        "endpoint ep-a: could not read role (and 499 more like it since the last said)",
    ]


def test_the_causes_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparse, "_CAUSES", 8)
    say = Sparse(logging.getLogger("pgplane.test"))
    for n in range(100):
        say.warning(n, "cause %d", n)
    assert len(say._said) <= 8
