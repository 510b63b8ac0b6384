"""The proxy's wrong-password throttle: per endpoint and address, and per address across
endpoints (a stranger naming a new made-up endpoint at each try is refused too)."""

from __future__ import annotations

import pytest

from pgplane.proxy.seam import RouteError
from pgplane.proxy.throttle import LoginThrottle


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
