"""One OS user per project, and root's work on the trees a tenant may have held."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from compute_helpers import free_port, lifecycle, query

from pgplane.compute.driver import ComputeError, ComputeSpec
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.copies.datacopy import copy_data_dir
from pgplane.compute.local.copies.timeline import check_data_version
from pgplane.compute.local.postgres.pidfile import read_pid_file
from pgplane.compute.local.tenants.ownership import hand_over
from pgplane.compute.local.tenants.user import RunAs
from pgplane.compute.local.tenants.users import (
    ComputeUsers,
    end_processes,
    processes_of,
    project_user_name,
    remove_files_of,
    remove_project_user,
)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="creating and switching users needs root")
# Debian's default NAME_REGEX for useradd, and Linux's 32 characters.
_USER_NAME = re.compile(r"[a-z][-a-z0-9_]{0,31}")


def _run(argv: list[str]) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def _daemon(run_as: RunAs) -> subprocess.Popen[bytes]:
    """What a superuser tenant may leave behind: a program in a session of its own."""
    return subprocess.Popen(
        ["sleep", "600"], user=run_as.uid, group=run_as.gid, start_new_session=True
    )


def _process_owner(pid: int) -> int:
    return Path(f"/proc/{pid}").stat().st_uid


def test_project_user_names_fit_and_never_meet() -> None:
    short = "misty-sea-12345678"
    assert project_user_name(short) == "pgp-misty-sea-12345678"
    longest = "a" * 60
    name = project_user_name(longest)
    assert name.startswith("pgp_") and len(name) == 32
    assert project_user_name("a" * 28) == "pgp-" + "a" * 28  # 32: still the plain form
    assert project_user_name("a" * 29).startswith("pgp_")
    # Ids are [a-z0-9-]: a digest name (with "_") is never a plain one, whatever the id.
    digest_like = name.removeprefix("pgp_")
    assert project_user_name(digest_like) != name
    for project_id in (short, longest, "0", "1-2-3", "x" * 29):
        assert _USER_NAME.fullmatch(project_user_name(project_id))
    assert project_user_name("b" * 60) != name


def test_as_an_ordinary_user_every_project_runs_as_ourselves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Run as root too: the decision alone, for an ordinary user's uid (no user is made either way).
    if os.geteuid() == 0:
        monkeypatch.setattr(os, "geteuid", lambda: 65534)
    users = ComputeUsers(None)
    assert not users.per_project
    assert users.find("proj-a") is None


@root_only
async def test_each_project_gets_a_user_of_its_own_as_root() -> None:
    users = ComputeUsers(None)
    try:
        a = await users.project("proj-users-a")
        b = await users.project("proj-users-b")
        shared = await users.shared()
        assert len({a.uid, b.uid, shared.uid, 0}) == 4
        assert a.gid != b.gid
        entry = pwd.getpwnam(a.name)
        assert entry.pw_shell.endswith("nologin")
        assert entry.pw_dir == "/nonexistent"
        assert (await users.project("proj-users-a")) == a
        assert users.find("proj-users-b") == b
        # A new process (a restart) finds the same user.
        assert ComputeUsers(None).find("proj-users-a") == a
    finally:
        await users.remove("proj-users-a")
        await users.remove("proj-users-b")
    with pytest.raises(KeyError):
        pwd.getpwnam(project_user_name("proj-users-a"))
    await users.remove("proj-users-a")  # idempotent
    assert users.find("proj-users-a") is None


@root_only
async def test_a_user_that_is_not_ours_is_never_taken_over_as_root() -> None:
    name = project_user_name("proj-stranger")
    _run(["useradd", "--system", "--no-create-home", name])
    try:
        with pytest.raises(ComputeError, match="not pgplane's"):
            await ComputeUsers(None).project("proj-stranger")
        with pytest.raises(ComputeError, match="not pgplane's"):
            remove_project_user("proj-stranger")
        pwd.getpwnam(name)  # still there
    finally:
        _run(["userdel", name])


@root_only
async def test_what_a_tenant_left_running_is_ended_as_root() -> None:
    users = ComputeUsers(None)
    run_as = await users.project("proj-leftover")
    try:
        # A superuser tenant's daemon: its own session, outliving the postmaster.
        daemon = _daemon(run_as)
        assert processes_of(run_as.uid) == [daemon.pid]
        assert end_processes(run_as) == [daemon.pid]
        assert daemon.wait(timeout=10) == -9
        assert processes_of(run_as.uid) == []
        with pytest.raises(ComputeError):
            end_processes(RunAs.current())  # never ourselves
    finally:
        await users.remove("proj-leftover")


@root_only
def test_a_deleted_users_files_in_shared_places_go_with_it_as_root(tmp_path: Path) -> None:
    shared = tmp_path / "shm"
    shared.mkdir(mode=0o1777)
    (shared / "left").write_text("the old tenant's")
    (shared / "dir" / "deeper").mkdir(parents=True)
    (shared / "link").symlink_to(tmp_path)
    (shared / "someone-elses").write_text("kept")
    for name in ("left", "dir", "dir/deeper", "link"):
        os.chown(shared / name, 54321, 54321, follow_symlinks=False)
    removed = remove_files_of(54321, (str(shared), str(tmp_path / "missing")))
    assert sorted(Path(p).name for p in removed) == ["dir", "left", "link"]
    assert [p.name for p in shared.iterdir()] == ["someone-elses"]
    assert tmp_path.is_dir()  # the link went, not what it led to


@root_only
def test_hand_over_follows_no_link_and_takes_no_one_elses_file_as_root(tmp_path: Path) -> None:
    tenant = RunAs(name="tenant", uid=54321, gid=54321, switch=True)
    old = 54320  # the user the tree belonged to (the shared compute user, say)
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = outside / "secret"
    secret.write_text("root's")
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_text("data")
    (tree / "sub" / "link").symlink_to(secret)
    (tree / "dirlink").symlink_to(outside)
    os.link(secret, tree / "sub" / "hardlink")  # as if protected_hardlinks were off
    os.mkfifo(tree / "fifo")
    for path in (tree, tree / "sub", tree / "sub" / "file", tree / "fifo"):
        os.chown(path, old, old)

    hand_over(tree, {old}, tenant)

    for path in (tree, tree / "sub", tree / "sub" / "file"):
        assert (path.lstat().st_uid, path.lstat().st_gid) == (54321, 54321), path
    for path in (outside, secret, tree / "sub" / "link", tree / "dirlink"):
        assert path.lstat().st_uid == 0, path
    assert (tree / "fifo").lstat().st_uid == old  # special files are left alone
    assert hand_over(tree, {old}, tenant) == 0  # done: nothing more to change


@root_only
def test_hand_over_takes_a_file_whose_every_link_it_hands_over(tmp_path: Path) -> None:
    # A completed WAL segment is linked into the branch's archive until a checkpoint unlinks
    # it: both links the project's, so the segment is too. One more link elsewhere: not.
    tenant = RunAs(name="tenant", uid=54321, gid=54321, switch=True)
    old = 54320
    pgdata, wal, elsewhere = tmp_path / "pgdata", tmp_path / "wal", tmp_path / "elsewhere"
    for directory in (pgdata / "pg_wal", wal, elsewhere):
        directory.mkdir(parents=True)
    ours, theirs = pgdata / "pg_wal" / "000000010000000000000001", pgdata / "pg_wal" / "other"
    ours.write_bytes(b"wal")
    os.link(ours, wal / ours.name)
    theirs.write_bytes(b"someone else's")
    os.link(theirs, wal / theirs.name)
    os.link(theirs, elsewhere / theirs.name)
    for path in (pgdata, pgdata / "pg_wal", ours, theirs):
        os.chown(path, old, old)

    hand_over(pgdata, {old}, tenant)
    assert ours.lstat().st_uid == old  # without the archive named, one link of two: left

    hand_over(pgdata, {old}, tenant, linked_within=[wal])
    assert ours.lstat().st_uid == tenant.uid
    assert theirs.lstat().st_uid == old


def _fake_data_dir(root: Path) -> Path:
    (root / "global").mkdir(parents=True)
    (root / "global" / "pg_control").write_bytes(b"\0" * 512)
    (root / "base" / "1").mkdir(parents=True)
    (root / "base" / "1" / "1259").write_bytes(b"x" * 8192)
    (root / "PG_VERSION").write_text("16\n")
    return root


def test_a_branch_copy_reads_no_link_and_no_special_file(tmp_path: Path) -> None:
    src = _fake_data_dir(tmp_path / "src")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("not the tenant's")
    cancel = threading.Event()
    copy_data_dir(src, tmp_path / "ok", online=False, keep_backup_label=False, cancel=cancel)
    assert (tmp_path / "ok" / "base" / "1" / "1259").read_bytes() == b"x" * 8192

    shutil.rmtree(src / "base" / "1")
    (src / "base" / "1").symlink_to(outside)
    with pytest.raises(ComputeError, match="symbolic link"):
        copy_data_dir(src, tmp_path / "a", online=True, keep_backup_label=False, cancel=cancel)
    assert not (tmp_path / "a" / "base" / "1" / "secret").exists()

    (src / "base" / "1").unlink()
    (src / "base" / "1").mkdir()
    os.mkfifo(src / "base" / "1" / "1259")  # a read of it would block for ever
    with pytest.raises(ComputeError, match="not a file or directory"):
        copy_data_dir(src, tmp_path / "b", online=True, keep_backup_label=False, cancel=cancel)


def test_a_pid_file_that_is_a_fifo_or_a_link_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").write_text("4242\n")
    (tmp_path / "postmaster.pid").symlink_to(tmp_path / "elsewhere")
    assert read_pid_file(tmp_path) is None
    (tmp_path / "postmaster.pid").unlink()
    os.mkfifo(tmp_path / "postmaster.pid")
    assert read_pid_file(tmp_path) is None  # and returns at once, rather than block


def test_a_pg_version_link_never_shows_what_it_leads_to(tmp_path: Path) -> None:
    # The version check's error reaches the account through its operation: a tenant must not
    # make it quote a file of the store's or another project's.
    secret = tmp_path / "secret"
    secret.write_text("npg_another_tenants_password")
    (tmp_path / "PG_VERSION").symlink_to(secret)
    with pytest.raises(ComputeError) as error:
        check_data_version(tmp_path, 16)
    assert "npg_" not in str(error.value)
    (tmp_path / "PG_VERSION").unlink()
    os.mkfifo(tmp_path / "PG_VERSION")
    with pytest.raises(ComputeError, match="unreadable data, not 16"):
        check_data_version(tmp_path, 16)  # at once, rather than block on the FIFO
    (tmp_path / "PG_VERSION").unlink()
    (tmp_path / "PG_VERSION").write_text("15\n")
    with pytest.raises(ComputeError, match="holds Postgres 15 data, not 16"):
        check_data_version(tmp_path, 16)


@root_only
async def test_detach_and_reattach_give_the_data_back_to_the_projects_user_as_root(
    driver: LocalComputeDriver,
) -> None:
    await lifecycle(driver, "proj-owned", "ep-owned")
    run_as = await driver.project_user("proj-owned")
    pgdata = driver.pgdata("proj-owned", "br-main")
    # The tenant left a daemon behind (root must not pack a tree something still changes).
    daemon = _daemon(run_as)
    await driver.detach_tenant(project_id="proj-owned")
    assert daemon.wait(timeout=10) == -9
    assert await driver.tenant_state(project_id="proj-owned") == "archived"
    archive_dir = driver.layout.archive("proj-owned")
    assert stat.S_IMODE(archive_dir.stat().st_mode) == 0o700
    assert archive_dir.stat().st_uid == 0

    await driver.reattach_tenant(project_id="proj-owned")
    assert {p.lstat().st_uid for p in [pgdata, *pgdata.rglob("*")]} == {run_as.uid}
    project_dir = driver.layout.project_dir("proj-owned")
    st = project_dir.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o710, 0, run_as.gid)
    assert stat.S_IMODE(pgdata.stat().st_mode) == 0o700
    # And it starts, as its own user, with its data.
    spec = ComputeSpec(
        project_id="proj-owned",
        branch_id="br-main",
        endpoint_id="ep-owned",
        pg_version=driver.pg_versions()[-1],
        port=free_port(),
    )
    await driver.start_compute(spec)
    try:
        assert await query(spec.port, "SELECT answer FROM t") == [(42,)]
        running = read_pid_file(pgdata)
        assert running is not None
        assert _process_owner(running.pid) == run_as.uid
    finally:
        await driver.stop_compute(
            project_id="proj-owned", branch_id="br-main", endpoint_id="ep-owned"
        )
