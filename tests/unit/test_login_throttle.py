"""The proxy's wrong-password throttle: per endpoint and address, and per address across
endpoints (a stranger naming a new made-up endpoint at each try is refused too)."""

from __future__ import annotations

import pytest

from pgplane.proxy.seam import RouteError
from pgplane.proxy.throttle import HOLD_SECONDS, REFUSALS_AT_ONCE, LoginThrottle, Throttled


def test_an_address_is_throttled_per_endpoint_and_across_endpoints() -> None:
    throttle = LoginThrottle(failures_per_minute=3)
    for _ in range(3):
        throttle.check("ep-a", "192.0.2.1")
        throttle.failed("ep-a", "192.0.2.1")
    with pytest.raises(RouteError, match="too many failed logins"):
        throttle.check("ep-a", "192.0.2.1")
    throttle.check("ep-b", "192.0.2.1")  # another endpoint: its own allowance
    throttle.check("ep-a", "192.0.2.2")  # another address too
    # Made-up endpoints, a new one each try: the address's own allowance (ten endpoints' worth)
    # runs out all the same.
    for i in range(27):
        throttle.check(f"ep-made-up-{i}", "192.0.2.1")
        throttle.failed(f"ep-made-up-{i}", "192.0.2.1")
    with pytest.raises(RouteError, match="too many failed logins"):
        throttle.check("ep-never-tried", "192.0.2.1")
    throttle.check("ep-never-tried", "192.0.2.2")  # never another address's


async def test_a_throttled_address_past_its_pace_is_refused_after_a_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A throttled address is refused at once a minute's worth of times, then once a second;
    a refusal past that is held first (a stranger dialling without pause was answered as
    fast as it dialled, a core's worth of the proxy)."""
    throttle = LoginThrottle(failures_per_minute=1)
    throttle.failed("ep-a", "192.0.2.1")
    held: list[float] = []

    async def sleep(seconds: float) -> None:
        held.append(seconds)

    monkeypatch.setattr("pgplane.proxy.throttle.asyncio.sleep", sleep)
    for _ in range(REFUSALS_AT_ONCE):
        with pytest.raises(Throttled):
            await throttle.admit("ep-a", "192.0.2.1")
    assert held == []
    with pytest.raises(Throttled, match="too many failed logins") as refused:
        await throttle.admit("ep-a", "192.0.2.1")
    assert refused.value.hold == HOLD_SECONDS and held == [HOLD_SECONDS]
    throttle.failed("ep-a", "192.0.2.2")
    with pytest.raises(Throttled) as other:  # another address keeps its own pace
        await throttle.admit("ep-a", "192.0.2.2")
    assert other.value.hold == 0 and held == [HOLD_SECONDS]
