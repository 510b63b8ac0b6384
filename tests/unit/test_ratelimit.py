"""The rate limiter's arithmetic, on a clock the test moves."""

from __future__ import annotations

import pytest

from pgplane.api.ratelimit import Limit, RateLimiter
from pgplane.core.gcra import address_key
from pgplane.errors import TooManyRequests

S = 1_000_000_000  # the limiter counts in nanoseconds


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * S)


def limiter(clock: Clock, *, per_minute: int = 0, burst: int = 0, failures: int = 0) -> RateLimiter:
    return RateLimiter(
        per_minute=per_minute,
        burst_per_second=burst,
        auth_failures_per_minute=failures,
        clock=clock,
    )


def admitted(rl: RateLimiter, account: str, route: str, n: int) -> int:
    """How many of ``n`` requests at one instant are admitted."""
    ok = 0
    for _ in range(n):
        try:
            rl.admit(account, route)
        except TooManyRequests:
            continue
        ok += 1
    return ok


def retry_after(rl: RateLimiter, account: str, route: str) -> int:
    with pytest.raises(TooManyRequests) as refused:
        rl.admit(account, route)
    return int(refused.value.headers["Retry-After"])


def test_a_burst_fits_exactly_and_refills_at_the_rate() -> None:
    limit, now = Limit(per_second=40, burst=40), 5 * S
    for _ in range(40):
        assert limit.wait("k", now) == 0
        limit.take("k", now)
    assert limit.wait("k", now) == S // 40  # one request's worth of refill
    assert limit.wait("k", now + S // 40) == 0
    assert limit.wait("other", now) == 0


def test_neon_defaults_a_route_burst_of_40_then_429_with_retry_after_1() -> None:
    clock = Clock()
    rl = limiter(clock, per_minute=700, burst=40)
    assert admitted(rl, "a", "GET /projects", 100) == 40
    assert retry_after(rl, "a", "GET /projects") == 1
    clock.advance(1)
    assert admitted(rl, "a", "GET /projects", 100) == 40


def test_the_account_limit_spans_routes_and_refills_at_per_minute() -> None:
    clock = Clock()
    rl = limiter(clock, per_minute=700, burst=40)
    ok = sum(admitted(rl, "a", f"route {i}", 40) for i in range(20))
    assert ok == 700  # a quiet account may spend a minute's allowance at once
    assert retry_after(rl, "a", "route 99") == 1  # 60/700 s, rounded up
    clock.advance(6.01)  # 6 s refill 70 requests at 700 a minute
    assert sum(admitted(rl, "a", f"route {i}", 40) for i in range(20, 40)) == 70


def test_800_evenly_over_a_minute_then_a_burst_on_one_route() -> None:
    """Scenario C6 on the fake clock: at least 700 of 800 pass, then the burst stops at 40."""
    clock = Clock()
    rl = limiter(clock, per_minute=700, burst=40)
    ok = 0
    for _ in range(800):
        ok += admitted(rl, "a", "GET /projects", 1)
        clock.advance(60 / 800)
    assert ok >= 700
    assert admitted(rl, "a", "GET /projects/{id}", 100) == 40


def test_refused_requests_count_nothing() -> None:
    clock = Clock()
    rl = limiter(clock, per_minute=60, burst=5)
    assert admitted(rl, "a", "r", 5) == 5
    assert admitted(rl, "a", "r", 1000) == 0  # hammering while refused does not dig deeper
    clock.advance(0.2)
    assert admitted(rl, "a", "r", 5) == 1
    # Refused by its route, a request did not spend the account's allowance: 6 of 60 are used.
    assert sum(admitted(rl, "a", f"other {i}", 5) for i in range(20)) == 54


def test_accounts_are_limited_apart() -> None:
    clock = Clock()
    rl = limiter(clock, per_minute=10, burst=10)
    assert admitted(rl, "a", "r", 50) == 10
    assert admitted(rl, "b", "r", 50) == 10


def test_zero_turns_a_limit_off() -> None:
    clock = Clock()
    assert admitted(limiter(clock), "a", "r", 10_000) == 10_000
    assert admitted(limiter(clock, per_minute=0, burst=3), "a", "r", 10) == 3
    assert admitted(limiter(clock, per_minute=3, burst=0), "a", "r", 10) == 3
    rl = limiter(clock)
    for _ in range(1000):
        rl.failed("10.0.0.1")
    rl.check_address("10.0.0.1")


def test_failed_authentication_throttles_the_address_not_others() -> None:
    clock = Clock()
    rl = limiter(clock, failures=50)
    for _ in range(50):
        rl.check_address("10.0.0.1")
        rl.failed("10.0.0.1")
    with pytest.raises(TooManyRequests) as refused:
        rl.check_address("10.0.0.1")
    assert refused.value.headers["Retry-After"] == "2"  # 60/50 s, rounded up
    rl.check_address("10.0.0.2")
    clock.advance(1.2)
    rl.check_address("10.0.0.1")  # one more attempt is allowed again


def test_ipv6_failures_count_per_64() -> None:
    clock = Clock()
    rl = limiter(clock, failures=3)
    for i in range(3):
        rl.failed(f"2001:db8:1:2::{i + 1}")
    with pytest.raises(TooManyRequests):
        rl.check_address("2001:db8:1:2:ffff::9")
    rl.check_address("2001:db8:1:3::1")
    assert address_key("2001:db8:1:2::1") == "2001:db8:1:2::/64"
    assert address_key("127.0.0.1") == "127.0.0.1"
    assert address_key("not:an address") == "not:an address"


def test_idle_keys_are_forgotten() -> None:
    limit, now = Limit(per_second=1, burst=1), 0
    for i in range(1000):
        limit.take(i, now)
    assert len(limit) == 1000
    now += 61 * S  # every bucket is full again and a sweep is due
    limit.take("fresh", now)
    assert len(limit) == 1
