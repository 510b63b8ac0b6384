"""The load, throughput, expiry and several-node benches' smoke runs (``--smoke``: small, no target
checked), beside tests/e2e/test_bench_smokes.py (a file of their own, so the two share the
suite's processes)."""

from __future__ import annotations

import os

import pytest

from tests.support import bench_smoke

PRINTS = {
    "store_backends": ("claims/s, 4 dispatchers", "write transactions/s"),
    "ws_throughput": ("WebSocket, TLS", "wss:// against TCP with TLS"),
    "load": ("POST p99 loaded/baseline", "server RSS"),
    "history": ("archiving cost", "point-in-time branch", "reset of a child"),
    "wake_remote": ("remote wake p50",),
    "expiry": ("expiry latency", "due while serve was down"),
}
AS_ROOT = {"neighbours": ("beside A",)}  # A's busy loops are capped by its compute's cgroup


@pytest.mark.parametrize("module", sorted(PRINTS))
def test_the_bench_runs(module: str) -> None:
    printed = bench_smoke(module)
    for figure in PRINTS[module]:
        assert figure in printed, printed


@pytest.mark.skipif(os.geteuid() != 0, reason="computes are capped by cgroups as root only")
@pytest.mark.parametrize("module", sorted(AS_ROOT))
def test_the_bench_runs_as_root(module: str) -> None:
    printed = bench_smoke(module)
    for figure in AS_ROOT[module]:
        assert figure in printed, printed
