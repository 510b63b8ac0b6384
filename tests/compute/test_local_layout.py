"""Paths under the data directory, and the id gate in front of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.layout import Layout, check_id, ensure_private_dir


@pytest.mark.parametrize("good", ["a", "br-7f3a", "ep-cool-darkness-12345678", "0" * 60, "-"])
def test_valid_ids_pass(good: str) -> None:
    assert check_id("id", good) == good


@pytest.mark.parametrize(
    "bad", ["", ".", "..", "../x", "/etc", "a/b", "A", "a b", "a\n", "a\x00", "é", "a" * 61]
)
def test_invalid_ids_are_refused(bad: str) -> None:
    with pytest.raises(ComputeError, match="invalid"):
        check_id("id", bad)


def test_paths_stay_under_the_data_dir(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert layout.pgdata("p", "b") == tmp_path / "projects/p/branches/b/pgdata"
    assert layout.storage_config("p") == tmp_path / "projects/p/storage.json"
    assert (
        layout.log_path("p-1", "br-1", "ep-1") == tmp_path / "projects/p-1/branches/br-1/ep-1.log"
    )
    assert layout.template(16) == tmp_path / "templates/16"


def test_socket_dirs_fit_the_unix_socket_limit() -> None:
    short = Layout(Path("/srv/pgplane"))
    assert short.socket_dir("ep-1") == Path("/srv/pgplane/run/ep-1")

    deep = Layout(Path("/srv/" + "d" * 80))
    longest = deep.socket_dir("e" * 60)
    assert longest.parent.parent == Path("/tmp")
    assert len(os.fsencode(longest / ".s.PGSQL.65535")) <= 107
    assert deep.run_root == Layout(Path("/srv/" + "d" * 80)).run_root  # stable per data dir
    assert deep.run_root != Layout(Path("/srv/" + "x" * 80)).run_root


def test_a_shared_socket_root_we_do_not_own_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir()
    trap = tmp_path / "pgplane-run"
    trap.symlink_to(target)
    with pytest.raises(ComputeError, match="not a directory owned by us"):
        ensure_private_dir(trap)
    mine = ensure_private_dir(tmp_path / "mine")
    assert mine.stat().st_mode & 0o777 == 0o711
