"""The object store's benchmark runs (``--smoke``: each measurement once, small), so it cannot rot
unnoticed; its figures are read from a full run, on a quiet machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_object_store_bench_runs() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.object_store", "--smoke"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for figure in ("shipping's cost", "RPO under pgbench", "baseline", "recover:"):
        assert figure in done.stdout, done.stdout
