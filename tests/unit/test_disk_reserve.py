"""The free space a branch copy must leave: 5% of the disk unless configured, at most 1 GiB."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.copies.branch import check_space, default_reserve

MB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize(
    ("disk", "reserve"),
    [(200 * MB, 10 * MB), (10 * GIB, 512 * MB), (20 * GIB, GIB), (2000 * GIB, GIB)],
)
def test_the_default_reserve_is_5_percent_of_the_disk_at_most_1_gib(
    disk: int, reserve: int
) -> None:
    assert default_reserve(disk) == reserve


class _Disk:
    """A statvfs result for a disk of ``total`` bytes with ``free`` of them available."""

    def __init__(self, total: int, free: int) -> None:
        self.f_frsize = 4096
        self.f_blocks = total // 4096
        self.f_bavail = free // 4096


def _parent(tmp_path: Path, size: int) -> Path:
    parent = tmp_path / "parent"
    (parent / "pg_wal").mkdir(parents=True)
    (parent / "base").write_bytes(b"\0" * size)
    (parent / "pg_wal" / "000000010000000000000001").write_bytes(b"\0" * MB)  # not counted
    return parent


# What a copy of the parent needs by the estimate: its files but pg_wal, and two segments.
NEEDED = 3 * MB + 2 * 16 * MB


@pytest.mark.parametrize(
    ("total", "free", "fits"),
    [
        (10 * GIB, NEEDED + 512 * MB, True),  # exactly the copy and 5%
        (10 * GIB, NEEDED + 512 * MB - 4096, False),
        (100 * GIB, NEEDED + GIB, True),  # 5% would be 5 GiB: the cap holds
        (100 * GIB, NEEDED + GIB - 4096, False),
    ],
)
def test_a_copy_must_leave_the_default_reserve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, total: int, free: int, fits: bool
) -> None:
    parent = _parent(tmp_path, 3 * MB)
    monkeypatch.setattr(os, "statvfs", lambda _path: _Disk(total, free))
    if fits:
        check_space(parent, tmp_path, None)
    else:
        with pytest.raises(ComputeError, match="No space left on device"):
            check_space(parent, tmp_path, None)


def test_a_configured_reserve_replaces_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    parent = _parent(tmp_path, 3 * MB)
    monkeypatch.setattr(os, "statvfs", lambda _path: _Disk(10 * GIB, NEEDED + MB))
    check_space(parent, tmp_path, MB)
    with pytest.raises(ComputeError, match="1 MB must stay free"):
        check_space(parent, tmp_path, MB + 4096)
