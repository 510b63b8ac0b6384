"""Finding Postgres installations."""

from __future__ import annotations

from pathlib import Path

from pgplane.compute.local.binaries import discover, pgserver_bin_dir, read_version


def test_the_pgserver_wheel_ships_postgres() -> None:
    bin_dir = pgserver_bin_dir()
    assert bin_dir is not None
    install = read_version(bin_dir)
    assert install is not None
    assert install.major >= 16
    assert install.initdb.is_file()


def test_discovery_maps_majors_to_bin_dirs() -> None:
    found = discover([])
    assert found
    assert list(found) == sorted(found)
    for major, install in found.items():
        assert install.major == major
        assert (install.bin_dir / "postgres").is_file()


def test_configured_dirs_come_first() -> None:
    bundled = pgserver_bin_dir()
    assert bundled is not None
    major = read_version(bundled).major  # type: ignore[union-attr]
    assert discover([bundled])[major].bin_dir == bundled.resolve()


def test_pgserver_only_ignores_the_rest() -> None:
    bundled = pgserver_bin_dir()
    assert bundled is not None
    found = discover([Path("/nonexistent/bin")], pgserver_only=True)
    assert [i.bin_dir for i in found.values()] == [bundled.resolve()]


def test_a_directory_without_postgres_is_not_an_installation(tmp_path: Path) -> None:
    assert read_version(tmp_path) is None
    assert discover([tmp_path, Path("/nonexistent/bin")]) == discover([])
