"""The small benches' smoke runs (``--smoke``: each measurement a few times, no target checked),
so that none can rot unnoticed (``bench.wake`` crashed for weeks on a compute with two socket
directories); their figures are read from full runs, on a quiet machine. The object store's and
the attacks' benches have files of their own (each a minute)."""

from __future__ import annotations

import pytest

from tests.support import bench_smoke

PRINTS = {
    "sql_latency": ("neon() over HTTPS", "TCP, open connection"),
    "wake": ("wake through the proxy", "per idle endpoint"),
    "operations_paging": ("first page:", "ratio deep / first:"),
    "snapshots": ("snapshot at the head:", "restore to a new branch:"),
    "project_create": ("POST /projects:", "bare initdb:"),
    "branch_create": ("branch of the parent", "branch of a fresh parent"),
    "schema_only": ("schema-only branch:", "by hand"),
    "replica_lag": ("target replica lag",),
    "console": ("console project page", "console operations fragment"),
    "proxy_throughput": ("pgbench -S", "of direct"),
}


@pytest.mark.parametrize("module", sorted(PRINTS))
def test_the_bench_runs(module: str) -> None:
    printed = bench_smoke(module)
    for figure in PRINTS[module]:
        assert figure in printed, printed
