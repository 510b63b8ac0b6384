"""What the store keeps of each branch's archive in the object store, on both stores: the
sizes sampled (the project's synthetic size counts its objects), the backup checks, and what
the console's Backups section says of them, WAL waiting past a minute told."""

from __future__ import annotations

import msgspec

from pgplane.config import Settings
from pgplane.console.usage_view import backups_view
from pgplane.core import clock, ids
from pgplane.core.models import BackupCheck, Branch
from pgplane.core.usage import BranchSizes
from pgplane.objectstore import verify
from pgplane.services import accounts, projects
from pgplane.services.projects import CreatedProject
from pgplane.store import Store
from tests.support import no_pg_settings

_SETTINGS = Settings(pg_versions=(16,), compute_ports=(45000, 45999))
MIB = 1 << 20


async def _project(store: Store) -> CreatedProject:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="archive@example.com")
        return await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=_SETTINGS,
            check_settings=no_pg_settings,
        )


async def test_the_archive_sampled_checked_and_shown(any_store: Store) -> None:
    store = any_store
    made = await _project(store)
    pid, bid = made.project.id, made.branch.id
    now = clock.now_us()
    sizes = BranchSizes(
        pid, bid, 10 * MIB, 40 * MIB, 30 * MIB, now, archived_at=now - 2_000_000,
        archived=5 * MIB, unarchived=3 * MIB, unarchived_since=now - 5_000_000,
    )  # fmt: skip
    async with store.write() as tx:
        await tx.put_branch_sizes(sizes, [])
    async with store.read() as tx:
        assert (await tx.get_branch_sizes(bid)) == sizes
        total = (await tx.project_storage([pid]))[pid]
        assert total.synthetic == 10 * MIB + 5 * MIB  # the history as its objects take there
        view = await backups_view(tx, pid, [made.branch], share_bytes=1024 * MIB)
    (row,) = view.rows
    assert (row.stored, row.checked) == ("5.0 MiB", "not yet")
    assert row.archived.endswith(" UTC")
    assert view.waiting is None  # five seconds: a round or two, not an outage

    check = BackupCheck(
        project_id=pid, branch_id=bid, checked_at=now, error="WAL file X is missing"
    )
    later = sizes_waiting_since(sizes, now - 90_000_000)
    async with store.write() as tx:
        await tx.put_backup_check(check)
        await tx.put_branch_sizes(later, [])
    async with store.read() as tx:
        assert await tx.backup_checks(pid) == [check]
        assert await tx.backup_checks() == [check]
        view = await backups_view(tx, pid, [made.branch], share_bytes=1024 * MIB)
    assert "did not restore (WAL file X is missing)" in view.rows[0].checked
    assert view.waiting is not None
    assert "3.0 MiB waits on its disk share (6% of 1.0 GiB used)" in view.waiting, view.waiting

    fixed = BackupCheck(project_id=pid, branch_id=bid, checked_at=now + 1, restorable_to=now)
    async with store.write() as tx:
        await tx.put_backup_check(fixed)  # the newest replaces the one before
    async with store.read() as tx:
        assert await tx.backup_checks(pid) == [fixed]


def sizes_waiting_since(sizes: BranchSizes, since: int) -> BranchSizes:
    return BranchSizes(
        sizes.project_id, sizes.branch_id, sizes.logical, sizes.data, sizes.history,
        sizes.sampled_us, archived_at=sizes.archived_at, archived=sizes.archived,
        unarchived=sizes.unarchived, unarchived_since=since,
    )  # fmt: skip


async def test_serve_checks_only_the_branches_due_not_one_made_a_moment_ago(
    any_store: Store,
) -> None:
    """A project is checked for its branch whose week has passed, and only that branch: one
    made a moment before has nothing in the bucket yet, and was reported unrestorable (the
    failed-branches gauge then said 1 for a week)."""
    store = any_store
    made = await _project(store)
    pid, now = made.project.id, clock.now_us()
    week = 7 * 86_400 * 1_000_000

    def branch(name: str, created_at: int) -> Branch:
        return msgspec.structs.replace(
            made.branch, id=ids.new_branch_id(), parent_id=made.branch.id, name=name,
            default=False, created_at=created_at, current_state="ready",
        )  # fmt: skip

    old, checked, young = branch("old", now - week - 1), branch("checked", 0), branch("young", now)
    async with store.write() as tx:
        await tx.place_project(project_id=pid, node="n1")
        for b in (old, checked, young):
            await tx.insert_branch(b)
        await tx.put_backup_check(BackupCheck(project_id=pid, branch_id=checked.id, checked_at=now))
    # The main branch is still being made ("init"): never due either.
    assert await verify.due(store, "n1", week) == {pid: {old.id}}
    assert await verify.due(store, "n2", week) == {}
