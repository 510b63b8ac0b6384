"""The size-limit library's build and cache, and what a compute's command line gets from it.

Real compiles against the bundled Postgres' headers (skipped where the machine has no C
compiler); made-up installations and compilers for the reasons a build cannot happen.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from pgplane.compute.driver import InvalidSettings
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.binaries import PgInstall, read_version, wheel_bin_dir
from pgplane.compute.local.postgres.command import check_settings
from pgplane.compute.local.postgres.limits.library import (
    Toolchain,
    Unbuildable,
    build,
    library_path,
    toolchain,
)
from pgplane.compute.local.postgres.limits.size_limit import SizeLimit, config_files


def _bundled() -> PgInstall:
    bin_dir = wheel_bin_dir()
    assert bin_dir is not None
    install = read_version(bin_dir)
    assert install is not None
    return install


def _tools() -> Toolchain:
    try:
        return toolchain(_bundled())
    except Unbuildable as exc:  # the bundled 18 has its headers; scripts/test needs a cc
        pytest.fail(f"the size-limit library cannot be built here: {exc}")


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def test_a_second_build_is_a_cache_hit(tmp_path: Path) -> None:
    install, tools = _bundled(), _tools()
    first, built = build(install, tmp_path, tools)
    assert built
    assert first.name.startswith(f"pgplane_limits-{install.major}-")
    assert stat.S_IMODE(first.stat().st_mode) == 0o644  # compute users load it
    mtime = first.stat().st_mtime_ns
    again, built = build(install, tmp_path, tools)
    assert (again, built) == (first, False)
    assert again.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # no build directory left


def test_a_new_minor_gets_a_library_of_its_own(tmp_path: Path) -> None:
    install = _bundled()
    newer = PgInstall(install.major, install.version + ".1", install.bin_dir)
    includes = Path("/usr/include/postgresql/server")
    assert library_path(tmp_path, install, includes) != library_path(tmp_path, newer, includes)
    assert library_path(tmp_path, install, includes) == library_path(tmp_path, install, includes)


def test_no_compiler_is_a_reason(tmp_path: Path) -> None:
    with pytest.raises(Unbuildable, match="no C compiler"):
        toolchain(_bundled(), {"PATH": str(tmp_path)})
    with pytest.raises(Unbuildable, match="no C compiler"):
        toolchain(_bundled(), {"PATH": os.environ["PATH"], "CC": str(tmp_path / "cc")})
    with pytest.raises(Unbuildable, match="no C compiler"):
        toolchain(_bundled(), {"PATH": os.environ["PATH"], "CC": "'gcc"})


def test_an_installation_without_headers_is_a_reason(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    install = PgInstall(15, "postgres (PostgreSQL) 15.18", bin_dir)
    cc = _script(tmp_path / "cc", "exit 0")
    with pytest.raises(Unbuildable, match="no pg_config"):
        toolchain(install, {"CC": str(cc)})
    _script(bin_dir / "pg_config", "echo /usr/include/postgresql/15/nowhere")
    with pytest.raises(Unbuildable, match=r"no server headers .*postgresql-server-dev-15"):
        toolchain(install, {"CC": str(cc)})


def test_a_failed_compile_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    install = _bundled()
    cc = _script(tmp_path / "cc", "echo 'cc: out of luck' >&2; exit 1")
    out = tmp_path / "extensions"
    out.mkdir()
    with pytest.raises(Unbuildable, match="out of luck"):
        build(install, out, Toolchain((str(cc),), tmp_path))
    assert list(out.iterdir()) == []


async def test_majors_that_cannot_build_run_without_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    install = PgInstall(15, "postgres (PostgreSQL) 15.18", tmp_path)  # no pg_config
    limit = SizeLimit(Layout(tmp_path), 3072, {15: install})
    with caplog.at_level(logging.WARNING):
        await limit.start()
        assert await limit.library(15) is None
        assert await limit.library(15) is None
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"Postgres 15 computes have no branch size limit: no pg_config in {tmp_path}"]


def test_the_value_file_changes_only_when_the_limit_does(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    assert SizeLimit(layout, 3072, {}).write_value()
    assert not SizeLimit(layout, 3072, {}).write_value()
    assert "pgplane.max_cluster_size = 3072\n" in layout.size_limit_conf.read_text()
    assert SizeLimit(layout, 0, {}).write_value()  # 0: none, which Postgres says as -1
    assert "pgplane.max_cluster_size = -1\n" in layout.size_limit_conf.read_text()
    assert stat.S_IMODE(layout.size_limit_conf.stat().st_mode) == 0o644


async def test_a_compute_preloads_it_after_its_own_libraries(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "data dir")
    limit = SizeLimit(layout, 3072, {})
    library = layout.extensions / "pgplane_limits-18-abc.so"
    own = {"Shared_Preload_Libraries": "pg_stat_statements", "work_mem": "4MB"}
    settings = await limit.settings(library, "p-1", "br-1", own)
    conf = layout.compute_conf("p-1", "br-1")
    assert settings == {
        "work_mem": "4MB",
        "shared_preload_libraries": f'pg_stat_statements,"{library}"',  # a space: quoted
        "config_file": str(conf),
    }
    text = conf.read_text()
    assert f"include_if_exists '{layout.pgdata('p-1', 'br-1')}/postgresql.conf'\n" in text
    assert f"include '{layout.size_limit_conf}'\n" in text
    assert config_files(["-c", f"config_file={conf}", "-c", "x=y"]) == [conf]
    conf.unlink()  # removed with its branch: written again
    alone = await limit.settings(library, "p-1", "br-1", {})
    assert alone["shared_preload_libraries"] == f'"{library}"'
    assert conf.read_text() == text


def test_a_tenant_cannot_set_the_platforms_variables() -> None:
    for name in ("pgplane.max_cluster_size", "PGPLANE.max_cluster_size", "config_file"):
        with pytest.raises(InvalidSettings, match="managed by pgplane"):
            check_settings({name: "-1"})
