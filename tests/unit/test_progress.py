"""A long step says what it is doing, then that it goes on, then how it ended; a quick one says
nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from pgplane.telemetry import progress

log = logging.getLogger("pgplane.test.progress")


class _Said(logging.Handler):
    def __init__(self, until: str) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.until = until
        self.heard = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self.until in self.lines[-1]:
            self.heard.set()


@pytest.fixture
def said() -> Iterator[_Said]:
    handler = _Said("still at it")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    yield handler
    log.removeHandler(handler)


async def test_a_quick_step_says_nothing(said: _Said) -> None:
    with progress.step(log, "a quick thing", after=60):
        await asyncio.sleep(0)
    assert said.lines == []


async def test_a_long_step_says_what_it_does_that_it_goes_on_and_how_it_ended(said: _Said) -> None:
    async with asyncio.timeout(30):
        with progress.step(log, "building it", after=0.01, every=0.01):
            await said.heard.wait()  # the work lasts until it was told twice
    first, going_on, ended = said.lines
    assert first == "building it ..."
    assert going_on.startswith("building it: still at it after ")
    assert ended.startswith("building it: done after ")


async def test_a_step_that_fails_says_it_stopped(said: _Said) -> None:
    async def copy() -> None:
        async with asyncio.timeout(30):
            with progress.step(log, "copying it", after=0.01, every=0.01):
                await said.heard.wait()
                raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        await copy()
    assert said.lines[-1].startswith("copying it: stopped after ")
