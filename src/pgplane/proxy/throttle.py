"""Wrong passwords, throttled per endpoint and client address, and per address.

A guesser gets a minute's allowance of failures for one endpoint from one address, then is
refused before any SCRAM exchange until the allowance refills; other addresses and other
endpoints are untouched, so one client's guessing never locks out another. An address also
has an allowance across every endpoint (ten endpoints' worth): a stranger naming a new made-up
endpoint id at each try, each a fresh per-endpoint allowance and a password hash's work, is
refused once it is spent. Only failures count: a good login neither spends nor repays the
allowance (as the API's failure limit).

A throttled address's refusals are cheap, but it can ask for them as fast as it dials: a few
addresses dialling without pause took most of a core of the proxy's from every other account.
So an address is told "too many failed logins" at once a minute's worth of times
(``REFUSALS_AT_ONCE``), then once a second; a refusal past that pace is held for
``HOLD_SECONDS`` before it is written, the decision taken before the hold (a refill that falls
meanwhile opens nothing for it). A held refusal is a sleeping coroutine on a connection that
counts against the address's connection cap, so an address is answered at most at that cap a
second.
"""

from __future__ import annotations

import asyncio
import time

from pgplane.core.gcra import Limit, address_key
from pgplane.proxy import wire
from pgplane.proxy.seam import RouteError
from pgplane.telemetry.metrics import NO_METRICS, Metrics

_SECOND = 1_000_000_000
FAILURES_PER_MINUTE = 30
_ENDPOINTS_PER_ADDRESS = 10  # an address's allowance across endpoints, in endpoints' worth
REFUSALS_AT_ONCE = 60  # a throttled address's refusals written at once, then one a second
HOLD_SECONDS = 1.0  # how long a refusal past that pace waits before it is written


class Throttled(RouteError):
    """Too many failed logins from this address; ``hold``: seconds to wait before saying so."""

    def __init__(self, endpoint_id: str, wait: int, *, hold: float) -> None:
        super().__init__(
            wire.CONNECTION_REJECTED,
            f"too many failed logins to endpoint {endpoint_id} from your address;"
            f" retry after {wait} s",
        )
        self.hold = hold


class LoginThrottle:
    def __init__(
        self, failures_per_minute: int = FAILURES_PER_MINUTE, metrics: Metrics = NO_METRICS
    ) -> None:
        # Every failed login reaches failed(), whatever the door: the one place to count them.
        self._metrics = metrics
        self._limit = (
            Limit(per_second=failures_per_minute / 60, burst=failures_per_minute)
            if failures_per_minute > 0
            else None
        )
        every = failures_per_minute * _ENDPOINTS_PER_ADDRESS
        self._per_address = (
            Limit(per_second=every / 60, burst=every) if failures_per_minute > 0 else None
        )
        self._refusals = Limit(per_second=1, burst=REFUSALS_AT_ONCE)  # per address

    def wait(self, endpoint_id: str, host: str) -> int:
        """Whole seconds until this address may try this endpoint again; 0 if it may now."""
        if self._limit is None or self._per_address is None:
            return 0
        now, address = time.monotonic_ns(), address_key(host)
        wait = max(
            self._limit.wait((endpoint_id, address), now),
            self._per_address.wait(address, now),
        )
        return 0 if wait == 0 else max(1, -(-wait // _SECOND))

    def check(self, endpoint_id: str, host: str) -> None:
        """:class:`Throttled` if this address may not try this endpoint now."""
        if wait := self.wait(endpoint_id, host):
            now, address = time.monotonic_ns(), address_key(host)
            paced = self._refusals.wait(address, now) == 0
            if paced:
                self._refusals.take(address, now)
            raise Throttled(endpoint_id, wait, hold=0.0 if paced else HOLD_SECONDS)

    async def admit(self, endpoint_id: str, host: str) -> None:
        """:meth:`check`, a refusal past the address's pace held before it is raised."""
        try:
            self.check(endpoint_id, host)
        except Throttled as exc:
            if exc.hold:
                await asyncio.sleep(exc.hold)
            raise

    def failed(self, endpoint_id: str, host: str) -> None:
        self._metrics.proxy_auth_failed()
        if self._limit is not None and self._per_address is not None:
            now, address = time.monotonic_ns(), address_key(host)
            self._limit.take((endpoint_id, address), now)
            self._per_address.take(address, now)
