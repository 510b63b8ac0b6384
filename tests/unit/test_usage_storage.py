"""Counting a branch's blocks as du does, on a tenant's tree: links not followed, each inode
once, bounded in time (issue 23)."""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from pgplane.compute.local.storage import MAX_DEPTH, allocated_bytes


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


def test_a_fifo_in_place_of_a_directory_never_holds_the_walk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tenant swaps a FIFO in for a directory between the walk's stat and its open: the open
    fails at once (O_DIRECTORY | O_NONBLOCK), where os.fwalk's plain O_RDONLY would wait for a
    writer for ever. The swap is made at the moment the walk opens the directory."""
    tree = tmp_path / "pgdata"
    (tree / "base").mkdir(parents=True)
    (tree / "PG_VERSION").write_text("18\n")
    real_open = os.open

    def swap_then_open(
        path: str, flags: int, mode: int = 0o777, *, dir_fd: int | None = None
    ) -> int:
        if path == "base":
            os.rmdir(tree / "base")
            os.mkfifo(tree / "base")
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swap_then_open)
    done: list[int | None] = []
    walker = threading.Thread(target=lambda: done.append(allocated_bytes(tree)), daemon=True)
    walker.start()
    walker.join(timeout=10)
    assert done, "the walk is held by the FIFO"
    assert done[0] is not None


def test_a_chain_deeper_than_the_walk_goes_gives_no_figure(tmp_path: Path) -> None:
    deep = tmp_path / "deep"
    deep.mkdir()
    fd = os.open(deep, os.O_RDONLY)
    try:
        for _ in range(MAX_DEPTH + 2):  # by descriptors: the path would pass PATH_MAX
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    assert allocated_bytes(deep) is None
