"""Counting a branch's blocks as du does, on a tenant's tree: links not followed, each inode
once, bounded in time (issue 23)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from pgplane.compute.local.storage import allocated_bytes


def _du(path: Path) -> int:
    done = subprocess.run(
        ["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[0])


def test_as_du_counts_without_following_a_tenant_s_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(4 << 20))  # what a planted link points to
    tree = tmp_path / "pgdata"
    (tree / "base" / "1").mkdir(parents=True)
    (tree / "base" / "1" / "rel").write_bytes(os.urandom(1 << 20))
    os.link(tree / "base" / "1" / "rel", tree / "base" / "twin")  # one inode, counted once
    (tree / "sparse").write_bytes(b"")
    with open(tree / "sparse", "r+b") as f:
        f.truncate(64 << 20)  # a hole takes no blocks
    os.symlink(outside / "big", tree / "link")
    os.symlink(outside, tree / "dirlink")
    counted = allocated_bytes(tree)
    assert counted == _du(tree)
    assert counted is not None and counted < 2 << 20
    assert allocated_bytes(tmp_path / "missing") == 0


def test_a_walk_past_its_time_gives_no_figure(tmp_path: Path) -> None:
    tree = tmp_path / "many"
    tree.mkdir()
    for i in range(50):
        (tree / str(i)).mkdir()
    assert allocated_bytes(tree, time_limit=-1) is None
