"""The HTTP throughput benches' smoke runs (``--smoke``: small, no target checked): each drives
the API with wrk (Debian's ``wrk``, which scripts/test installs as root, as it does Chromium)."""

from __future__ import annotations

import shutil

import pytest

from tests.support import bench_smoke

PRINTS = {
    "api_throughput": ("median pgplane, limits on:", "ratio pgplane / baseline:"),
    "metrics_overhead": ("ratio of the medians:",),
    "nodes": ("two nodes / one node, PostgreSQL:", "operations claimed", "a node's recovery"),
}


@pytest.mark.skipif(
    shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)"
)
@pytest.mark.parametrize("module", sorted(PRINTS))
def test_the_bench_runs(module: str) -> None:
    printed = bench_smoke(module)
    for figure in PRINTS[module]:
        assert figure in printed, printed
