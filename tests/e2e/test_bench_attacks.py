"""The neighbours' benchmark runs (``--smoke``: each attack once, briefly), so it cannot rot
unnoticed, and beside each attack none of the other account's requests fails; its figures are
read from a full run, on a quiet machine (docs/fair-shares.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the attacks need computes walled, in cgroups: root"
)


def test_every_attack_runs_and_fails_none_of_the_neighbours_requests() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.attacks", "--smoke"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for attack in ("cpu", "machine", "body", "strangers", "stopped", "pool"):
        assert f"target {attack} wake: none of B's failed: met" in done.stdout, done.stdout
    assert "tries a second" in done.stdout, done.stdout
