"""The pool of spare files and directories that branch copies rename into place."""

from __future__ import annotations

import os
from pathlib import Path

from pgplane.compute.local.copies import spares
from pgplane.compute.local.copies.spares import SparePool


def test_fills_to_what_is_wanted_and_places_by_rename(tmp_path: Path) -> None:
    pool = SparePool(tmp_path / "spare")
    pool.adopt()
    assert not pool.needs_filling()
    pool.want(5, 2)
    assert pool.fill() == 7
    assert pool.counts() == (5, 2)
    pool.want(3, 1)  # never less than asked before
    assert not pool.needs_filling()

    target = tmp_path / "copy"
    assert pool.place_dir(str(target))
    assert target.is_dir() and (target.stat().st_mode & 0o777) == 0o700
    assert pool.place_file(str(target / "a"))
    assert (target / "a").stat().st_size == 0
    assert (target / "a").stat().st_mode & 0o777 == 0o600
    assert pool.counts() == (4, 1)
    assert len(os.listdir(tmp_path / "spare")) == 5


def test_never_replaces_an_existing_path(tmp_path: Path) -> None:
    pool = SparePool(tmp_path / "spare")
    pool.adopt()
    pool.want(1, 0)
    pool.fill()
    existing = tmp_path / "existing"
    existing.write_text("data")
    assert not pool.place_file(str(existing))
    assert existing.read_text() == "data"
    assert pool.counts() == (1, 0)  # the spare is still there for the next copy


def test_adopts_empty_spares_and_removes_anything_else(tmp_path: Path) -> None:
    directory = tmp_path / "spare"
    directory.mkdir()
    (directory / "empty").touch()
    (directory / "written").write_text("x")
    (directory / "dir").mkdir()
    (directory / "full").mkdir()
    (directory / "full" / "f").touch()
    (tmp_path / "target").touch()
    os.link(tmp_path / "target", directory / "linked")
    pool = SparePool(directory)
    pool.adopt()
    assert pool.counts() == (1, 1)
    assert sorted(os.listdir(directory)) == ["dir", "empty"]
    assert (tmp_path / "target").exists()


def test_wants_are_capped_and_a_stopped_fill_returns(tmp_path: Path) -> None:
    pool = SparePool(tmp_path / "spare")
    pool.adopt()
    pool.want(10**9, 10**9)
    pool.stop()
    assert pool.fill() == 0
    assert pool.needs_filling()
    assert spares.MAX_FILES < 10**9
