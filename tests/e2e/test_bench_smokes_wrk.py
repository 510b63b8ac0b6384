"""The HTTP throughput benches' smoke runs (``--smoke``: small, no target checked): each drives
the API with wrk (Debian's ``wrk``, which scripts/test installs, as it does Chromium: never
skipped, so a machine without it fails here rather than passing unmeasured)."""

from __future__ import annotations

import pytest

from tests.support import bench_smoke

PRINTS = {
    "api_throughput": ("median pgplane, limits on:", "ratio pgplane / baseline:"),
    "metrics_overhead": ("ratio of the medians:",),
}
# Three servers and a node's recovery (45 s): ``-m slow``, before a change to nodes lands.
SLOW = {
    "nodes": ("two nodes / one node, PostgreSQL:", "operations claimed", "a node's recovery"),
}


@pytest.mark.parametrize(
    "module", [*sorted(PRINTS), *(pytest.param(m, marks=pytest.mark.slow) for m in sorted(SLOW))]
)
def test_the_bench_runs(module: str) -> None:
    printed = bench_smoke(module)
    for figure in {**PRINTS, **SLOW}[module]:
        assert figure in printed, printed
