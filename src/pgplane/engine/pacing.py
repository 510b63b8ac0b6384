"""Compute starts paced per account: a burst at once, then so many a minute.

A start is the dearest thing an account can ask for again and again: a Postgres start-up and
shutdown, a sandbox's namespaces made and torn down, cgroups joined, the platform's bookkeeping,
~100 ms of the machine's CPU a wake and suspend, most of it outside the account's own cgroup.
An account that wakes and suspends its computes in a loop (a connection, then the API's
suspend, four times a second) slowed every other account's logins and wakes by a third.
Past its burst, an account's starts wait their turn in its queue (never refused: a waking
client waits as for a slow start); other accounts' starts are not counted with them.

The counts are this process's (core/gcra.py), as the API's rate limits are: over N nodes an
account may start N times as many. A setting of 0 turns the pace off.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pgplane.core.gcra import Limit

_SECOND = 1_000_000_000


class StartPacing:
    def __init__(
        self, *, per_minute: int, burst: int, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self._limit = (
            Limit(per_second=per_minute / 60, burst=max(1, burst)) if per_minute > 0 else None
        )
        self._clock = clock

    def wait(self, account: str) -> float:
        """Seconds until the account may start a compute; 0 if it may now."""
        if self._limit is None:
            return 0.0
        return self._limit.wait(account, self._clock()) / _SECOND

    def take(self, account: str) -> None:
        """Count a start of the account's, which :meth:`wait` allowed."""
        if self._limit is not None:
            self._limit.take(account, self._clock())
