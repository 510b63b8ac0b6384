"""The object store's benchmark runs (``--smoke``: each measurement once, small), so it cannot rot
unnoticed; its figures are read from a full run, on a quiet machine. A minute of SeaweedFS,
pgbench and recoveries: ``-m slow``, run before a change to shipping or recovery lands."""

from __future__ import annotations

import pytest

from tests.support import bench_smoke


@pytest.mark.slow
def test_the_object_store_bench_runs() -> None:
    printed = bench_smoke("object_store")
    for figure in ("shipping's cost", "RPO under pgbench", "baseline", "recover:"):
        assert figure in printed, printed
