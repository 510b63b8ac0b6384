"""Load: 200 clients polling operations while branches are created and deleted.

Two shapes. The stress: 200 pollers of one account's project every second, the rate limits off,
branches churned as fast as they finish; what must hold is no 5xx, every operation settled, the
server's memory flat. Scenario C5: 200 clients, each with a key of its own, polling every 5 s at
the default rate limits while 20 branches a minute are created; nothing may be refused (no 429),
nothing may fail. How fast requests are answered meanwhile is measured by ``bench/load.py`` (no
timed assertions here). The default runs are short; the five-minute ones are marked slow
(``pytest -m slow``).
"""

from __future__ import annotations

import asyncio
import statistics

import pytest

from tests.conftest import assert_operations_settled
from tests.load import C5_POLL_EVERY, c5_platform, run_c5, run_load, unused_keys
from tests.support import Api, running_server

# The stress is one account's: Neon's per-account limits would answer most polls with 429.
NO_LIMITS = {"PGPLANE_RATE_LIMIT_PER_MINUTE": "0", "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0"}


def _stress(seconds: float) -> None:
    with running_server(**NO_LIMITS) as server:
        _, key = server.create_key("load@example.com")
        with Api(server, key) as api:
            result = asyncio.run(run_load(server, api, clients=200, seconds=seconds))
        assert result.server_errors == 0, result.statuses
        assert result.errors == []
        assert result.branches_created >= 3
        # The pollers really polled: each about once in 10 s at least (they poll every second;
        # the suite runs beside other files, and bench/load.py measures how fast they are served).
        assert len(result.poll_ms) >= 200 * seconds / 10, len(result.poll_ms)
        assert_operations_settled(server)
        # Flat: after warming up, the second half never grows past the first half's peak by
        # more than noise (a leak per request would: ~200 requests a second here).
        half = len(result.rss_mb) // 2
        assert max(result.rss_mb[half:]) - max(result.rss_mb[:half]) < 25, result.rss_mb


def test_two_hundred_pollers_and_branch_churn_for_20_seconds() -> None:
    _stress(seconds=20)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_two_hundred_pollers_and_branch_churn_for_five_minutes() -> None:
    _stress(seconds=300)


@pytest.mark.parametrize(
    "seconds",
    [10, pytest.param(300, marks=[pytest.mark.slow, pytest.mark.timeout(1800)])],
    ids=lambda s: f"{s}s",
)
def test_c5_two_hundred_keys_polling_at_the_default_rate_limits(seconds: float) -> None:
    with c5_platform() as (server, api, watches):
        result = asyncio.run(run_c5(server, api, watches, seconds))
        assert_operations_settled(server)
        # Each of the 200 clients was authenticated as itself: every key shows its use.
        assert unused_keys(server, watches) == []
    gets, posts = sorted(result.poll_ms), sorted(result.post_ms)
    # Figures to read, not to assert (bench/load.py --c5 holds them to the scenario's targets).
    print(
        f"C5: {len(watches)} keys, {len(gets)} GETs: p50 {statistics.median(gets):.1f} ms,"
        f" p99 {gets[int(len(gets) * 0.99)]:.1f} ms; {len(posts)} POSTs/DELETEs:"
        f" p99 {posts[int(len(posts) * 0.99)]:.1f} ms; {result.branches_created} branches;"
        f" statuses {dict(sorted(result.statuses.items()))}"
    )
    # Nothing refused (no 429), nothing failed (no 5xx): only 200 and 201 came back.
    assert set(result.statuses) <= {200, 201}, result.statuses
    assert result.errors == []
    assert result.branches_created >= 2
    # The pollers really polled, each about every 5 s (half of that leaves plenty of margin).
    assert len(gets) >= len(watches) * seconds / C5_POLL_EVERY / 2
