"""Saying what a long step is doing while it works.

A step that ends quickly says nothing more than what its code logs anyway: a CLI command that
took 50 ms prints no progress, and ``serve``'s log keeps one line per thing done. A step that
runs past ``after`` seconds says what it is doing, then again every ``every`` seconds with the
time spent, and how it ended: someone watching ``serve`` build a template, adopt computes or
suspend them at a stop, or a CLI command wait for the store ``serve`` is writing, sees work going
on rather than a silence that could be a hang.

It speaks through the ``logging`` module, so it reaches whatever the process writes its log to
(``serve``: text or JSON lines, with the ids in context; the CLI: plain lines on stderr, see
``cli/common.py``). Timers run on the event loop: the step must await (its blocking parts in
threads) for them to fire.
"""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType

AFTER_SECONDS = 1.0
EVERY_SECONDS = 10.0


def step(
    log: logging.Logger, what: str, *, after: float = AFTER_SECONDS, every: float = EVERY_SECONDS
) -> Step:
    """``with step(log, "building the Postgres 18 template"):`` around awaited work."""
    return Step(log, what, after=after, every=every)


class Step:
    """One step's timers; see :func:`step`."""

    __slots__ = ("_after", "_every", "_log", "_loop", "_spoke", "_started", "_timer", "_what")

    def __init__(
        self,
        log: logging.Logger,
        what: str,
        *,
        after: float = AFTER_SECONDS,
        every: float = EVERY_SECONDS,
    ) -> None:
        self._log = log
        self._what = what
        self._after = after
        self._every = every
        self._spoke = False
        self._timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        # The callback runs in a copy of this context: a JSON line carries the step's ids.
        self._timer = self._loop.call_later(self._after, self._say)

    def _say(self) -> None:
        if self._spoke:
            spent = self._loop.time() - self._started
            self._log.info("%s: still at it after %.0f s", self._what, spent)
        else:
            self._log.info("%s ...", self._what)
            self._spoke = True
        self._timer = self._loop.call_later(self._every, self._say)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._spoke:
            spent = self._loop.time() - self._started
            ended = "done" if exc_type is None else "stopped"  # its error is told by its caller
            self._log.info("%s: %s after %.1f s", self._what, ended, spent)
