"""The neighbours' benchmark runs (``--smoke``: each attack once, briefly), so it cannot rot
unnoticed, and beside each attack none of the other account's requests fails; its figures are
read from a full run, on a quiet machine (docs/fair-shares.md)."""

from __future__ import annotations

import os

import pytest

from tests.support import bench_smoke

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks need computes walled, in cgroups: root"
)


def test_every_attack_runs_and_fails_none_of_the_neighbours_requests() -> None:
    printed = bench_smoke("attacks")
    for attack in ("cpu", "machine", "body", "strangers", "stopped", "pool"):
        assert f"target {attack} wake: none of B's failed: met" in printed, printed
    assert "tries a second" in printed, printed
