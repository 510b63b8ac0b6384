"""The HTTP throughput benches' smoke runs (``--smoke``: small, no target checked): each drives
the API with wrk (Debian's ``wrk``, which scripts/test installs, as it does Chromium: never
skipped, so a machine without it fails here rather than passing unmeasured)."""

from __future__ import annotations

import pytest

from tests.support import bench_smoke

PRINTS = {
    "api_throughput": ("median pgplane, limits on:", "ratio pgplane / baseline:"),
    "metrics_overhead": ("ratio of the medians:",),
    "nodes": ("two nodes / one node, PostgreSQL:", "operations claimed", "a node's recovery"),
}


@pytest.mark.parametrize("module", sorted(PRINTS))
def test_the_bench_runs(module: str) -> None:
    printed = bench_smoke(module)
    for figure in PRINTS[module]:
        assert figure in printed, printed
