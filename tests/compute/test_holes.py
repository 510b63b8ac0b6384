"""A completed segment's zero tail freed: the same bytes read back, fewer blocks held."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from pgplane.compute.local.shared.holes import free_zero_tail
from pgplane.compute.local.tenants import untrusted


def test_the_zero_tail_goes_and_the_bytes_stay(tmp_path: Path) -> None:
    seg = tmp_path / "000000010000000000000002"
    data = os.urandom(20_000) + b"\0" * ((16 << 20) - 20_000)
    seg.write_bytes(data)
    before = seg.stat().st_blocks
    freed = free_zero_tail(untrusted.under(tmp_path, seg.name))
    assert freed == (16 << 20) - 24_576  # from the page after the last written byte
    assert hashlib.sha256(seg.read_bytes()).digest() == hashlib.sha256(data).digest()
    assert seg.stat().st_size == 16 << 20
    assert seg.stat().st_blocks < before


def test_a_full_file_and_a_link_are_left_alone(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.write_bytes(os.urandom(1 << 20))
    assert free_zero_tail(untrusted.under(tmp_path, "full")) == 0
    (tmp_path / "link").symlink_to(full)
    with pytest.raises(OSError, match="symbolic link"):
        free_zero_tail(untrusted.under(tmp_path, "link"))
