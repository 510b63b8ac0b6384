"""Load: 200 clients polling operations while branches are created and deleted.

What must hold under it: no 5xx, every operation settled, the server's memory flat. How fast the
POSTs are answered meanwhile is measured by ``bench/load.py`` (no timed assertions here). The
default run is short; the several-minute one is marked slow (``pytest -m slow``).
"""

from __future__ import annotations

import asyncio

import pytest

from tests.conftest import assert_operations_settled
from tests.load import run_load
from tests.support import Api, running_server

# The load is one account's: Neon's per-account limits would answer most polls with 429.
NO_LIMITS = {"PGPLANE_RATE_LIMIT_PER_MINUTE": "0", "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0"}


def _run(seconds: float) -> None:
    with running_server(**NO_LIMITS) as server:
        _, key = server.create_key("load@example.com")
        with Api(server, key) as api:
            result = asyncio.run(run_load(server, api, clients=200, seconds=seconds))
        assert result.server_errors == 0, result.statuses
        assert result.errors == []
        assert result.branches_created >= 3
        assert len(result.poll_ms) > 100 * seconds  # the pollers really polled (200 a second)
        assert_operations_settled(server)
        # Flat: after warming up, the second half never grows past the first half's peak by
        # more than noise (a leak per request would: ~200 requests a second here).
        half = len(result.rss_mb) // 2
        assert max(result.rss_mb[half:]) - max(result.rss_mb[:half]) < 25, result.rss_mb


def test_two_hundred_pollers_and_branch_churn() -> None:
    _run(seconds=20)


@pytest.mark.slow
def test_two_hundred_pollers_and_branch_churn_for_five_minutes() -> None:
    _run(seconds=300)
