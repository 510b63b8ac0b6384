"""Rate limits: per account and route, and on failed authentication per client address.

Two defences, both applied by the authentication hook (``auth.py``):

- An account may make ``rate_limit_per_minute`` requests a minute, sustained (one that was quiet
  may spend a minute's allowance at once), and at most ``rate_limit_burst_per_second`` a second on
  any one route (one operation of the API: a method on a path template). The defaults are Neon's
  published figures: 700 a minute per account, bursts of 40 a second per route.
- A client address may fail authentication ``auth_failures_per_minute`` times a minute. Past that,
  its requests are refused before any key they carry is looked at, valid or not, until it may fail
  again: a key guesser learns nothing more. Success never pays a failure back, or an attacker with
  an account of their own could interleave good requests to keep guessing.

A refusal is ``TooManyRequests`` (429) with ``Retry-After`` in whole seconds, and counts nothing.

Each limit is GCRA (the generic cell rate algorithm): a token bucket kept as one number per key,
the moment its bucket will be full again, in integer nanoseconds so that ``burst`` requests at one
instant fit exactly. The state lives in this process's memory and is used only from the event
loop, between awaits: exact for one ``serve``. Several nodes each keep their own, on purpose, so
over N nodes an account gets at most N times the limits (the README says how an operator holds a
total): sharing them through the store would make every request, reads too, a write in the
queue of the store's one writer. Quotas, which must hold platform-wide, are counted in the store
(``services/quotas.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable

from pgplane.config import Settings
from pgplane.core.gcra import Limit, address_key
from pgplane.errors import TooManyRequests

_SECOND = 1_000_000_000


def _refuse(wait: int, message: str) -> TooManyRequests:
    seconds = max(1, -(-wait // _SECOND))  # rounded up: a retry after it is admitted
    return TooManyRequests(
        f"{message}; retry after {seconds} s", headers={"Retry-After": str(seconds)}
    )


class RateLimiter:
    """The limits of one API process; a setting of 0 turns its limit off."""

    def __init__(
        self,
        *,
        per_minute: int,
        burst_per_second: int,
        auth_failures_per_minute: int,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._per_minute = per_minute
        self._burst = burst_per_second
        self._account = (
            Limit(per_second=per_minute / 60, burst=per_minute) if per_minute > 0 else None
        )
        self._route = (
            Limit(per_second=burst_per_second, burst=burst_per_second)
            if burst_per_second > 0
            else None
        )
        self._failures = (
            Limit(per_second=auth_failures_per_minute / 60, burst=auth_failures_per_minute)
            if auth_failures_per_minute > 0
            else None
        )
        self._clock = clock

    @classmethod
    def from_settings(cls, settings: Settings) -> RateLimiter:
        return cls(
            per_minute=settings.rate_limit_per_minute,
            burst_per_second=settings.rate_limit_burst_per_second,
            auth_failures_per_minute=settings.auth_failures_per_minute,
        )

    def admit(self, account_id: str, route: Hashable) -> None:
        """Count a request of ``account_id`` on ``route``, or refuse it and count nothing."""
        account, per_route = self._account, self._route
        if account is None and per_route is None:
            return
        now = self._clock()
        route_key = (account_id, route)
        if account is not None and (wait := account.wait(account_id, now)):
            raise _refuse(wait, f"rate limit exceeded: {self._per_minute} requests a minute")
        if per_route is not None and (wait := per_route.wait(route_key, now)):
            raise _refuse(
                wait, f"rate limit exceeded: {self._burst} requests a second on this route"
            )
        if account is not None:
            account.take(account_id, now)
        if per_route is not None:
            per_route.take(route_key, now)

    def check_address(self, host: str) -> None:
        """Refuse a request from ``host`` while it has used up its authentication failures."""
        failures = self._failures
        if failures is None or not failures:  # no failures anywhere: the usual case, kept cheap
            return
        if wait := failures.wait(address_key(host), self._clock()):
            raise _refuse(wait, "too many failed authentication attempts from this address")

    def failed(self, host: str) -> None:
        """Count a failed authentication from ``host``.

        Counted even past the limit (requests admitted together may all fail): the address then
        waits that much longer, so over time it never fails faster than the limit.
        """
        if self._failures is not None:
            self._failures.take(address_key(host), self._clock())
