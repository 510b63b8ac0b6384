"""The store's own guarantees, below the services: unique names and exact operation pages, on
both backends (SQLite, and PostgreSQL on the test process's cluster).

Services check little before they write; what makes "two requests, one name" end with one row is
the store's unique indexes. These tests write through the store's methods (and raw SQL) with no
service in front, as two racing requests or another process would, and expect a conflict, never
an integrity error that would become a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import msgspec
import pytest

from pgplane.config import Settings
from pgplane.core import clock, ids
from pgplane.core.models import Branch, Endpoint, Role, Snapshot
from pgplane.errors import AlreadyExists, Conflict
from pgplane.services import accounts, projects
from pgplane.services.projects import CreatedProject
from pgplane.store import Store
from pgplane.store.sqlite import SqliteStore
from pgplane.store.sqlite.migrate import migrate
from tests.stores import BACKENDS, UNIQUE_ERRORS, new_location, open_at, raw_sql
from tests.support import finished_operation, no_pg_settings


@pytest.fixture
def store(any_store: Store) -> Store:
    return any_store


async def _project(store: Store) -> CreatedProject:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="store@example.com")
        return await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(pg_versions=(16,), compute_ports=(45000, 45999)),
            check_settings=no_pg_settings,
        )


def _child(parent: Branch, name: str) -> Branch:
    """A new branch row under ``parent``, as create_branch would insert it."""
    return msgspec.structs.replace(
        parent, id=ids.new_branch_id(), parent_id=parent.id, name=name, default=False
    )


def _role(branch_id: str, name: str) -> Role:
    now = clock.now_us()
    return Role(
        branch_id=branch_id,
        name=name,
        password="secret",
        protected=False,
        created_at=now,
        updated_at=now,
    )


def _endpoint(like: Endpoint, *, branch_id: str, port: int) -> Endpoint:
    return msgspec.structs.replace(like, id=ids.new_endpoint_id(), branch_id=branch_id, port=port)


def test_every_name_rule_is_a_unique_index(tmp_path: Path) -> None:
    """The rules are in the schema itself, so no code path (or other program) can skip them."""
    with sqlite3.connect(tmp_path / "schema.db", isolation_level=None) as db:
        migrate(db)
        unique = dict(
            db.execute(
                "SELECT name, sql FROM sqlite_master"
                " WHERE type = 'index' AND sql LIKE 'CREATE UNIQUE%'"
            )
        )
    assert "(project_id, name) WHERE deleted_at IS NULL" in unique["branches_unique_name"]
    assert "(branch_id, name) WHERE deleted_at IS NULL" in unique["roles_unique_name"]
    assert "(branch_id, name) WHERE deleted_at IS NULL" in unique["databases_unique_name"]
    assert "type = 'read_write' AND deleted_at IS NULL" in unique["endpoints_one_read_write"]
    assert "(port) WHERE deleted_at IS NULL" in unique["endpoints_unique_port"]
    assert "(project_id, created_at)" in unique["operations_page"]


async def test_a_duplicate_name_written_past_the_services_is_a_conflict(store: Store) -> None:
    created = await _project(store)
    pid, main = created.project.id, created.branch
    owner = created.roles[0].name
    cases = [
        ("BRANCH_ALREADY_EXISTS", lambda tx: tx.insert_branch(_child(main, main.name))),
        ("ROLE_ALREADY_EXISTS", lambda tx: tx.insert_role(_role(main.id, owner))),
        (
            "DATABASE_ALREADY_EXISTS",
            lambda tx: tx.insert_database(
                branch_id=main.id, name="neondb", owner_name=owner, now=clock.now_us()
            ),
        ),
    ]
    for code, write in cases:
        with pytest.raises(AlreadyExists) as raised:
            async with store.write() as tx:
                await write(tx)
        assert raised.value.code == code
        assert raised.value.status == 409
        assert "already exists" in raised.value.message

    # A second read_write endpoint on the branch, on a free port: the branch's one place is taken.
    with pytest.raises(AlreadyExists) as raised:
        async with store.write() as tx:
            await tx.insert_endpoint(_endpoint(created.endpoint, branch_id=main.id, port=46001))
    assert raised.value.code == "ENDPOINT_ALREADY_EXISTS"

    # Renames into a taken name are conflicts too.
    async with store.write() as tx:
        other = _child(main, "other")
        await tx.insert_branch(other)
        second_db = await tx.insert_database(
            branch_id=main.id, name="second", owner_name=owner, now=clock.now_us()
        )
    with pytest.raises(AlreadyExists, match='branch_name:"main"'):
        async with store.write() as tx:
            await tx.update_branch(msgspec.structs.replace(other, name=main.name))
    with pytest.raises(AlreadyExists, match='database_name:"neondb"'):
        async with store.write() as tx:
            await tx.update_database(msgspec.structs.replace(second_db, name="neondb"))

    # A port another endpoint holds: a conflict, but not one about names.
    with pytest.raises(Conflict) as port_taken:
        async with store.write() as tx:
            await tx.insert_endpoint(
                _endpoint(created.endpoint, branch_id=other.id, port=created.endpoint.port)
            )
    assert not isinstance(port_taken.value, AlreadyExists)
    assert "port" in port_taken.value.message

    # Nothing of the refused writes was kept; a deleted name is free again.
    async with store.read() as tx:
        assert sorted(b.name for b in await tx.list_branches(pid)) == ["main", "other"]
        assert [r.name for r in await tx.list_roles(main.id)] == [owner]
        assert sorted(d.name for d in await tx.list_databases(main.id)) == ["neondb", "second"]
        assert len(await tx.list_endpoints(pid)) == 1
    async with store.write() as tx:
        await tx.delete_branch(branch_id=other.id, now=clock.now_us())
        await tx.insert_branch(_child(main, "other"))


async def test_raw_sql_cannot_duplicate_a_name_either(store: Store) -> None:
    created = await _project(store)
    with pytest.raises(UNIQUE_ERRORS, match=r"(?i)unique|duplicate"):
        raw_sql(
            store,
            "INSERT INTO branches (id, project_id, name, is_default, protected, current_state,"
            " state_changed_at, created_at, updated_at)"
            " VALUES ('br-raw', ?, 'main', 0, 0, 'ready', 0, 0, 0)",
            (created.project.id,),
        )


@pytest.mark.parametrize("backend", BACKENDS)
async def test_two_writers_racing_for_one_name_leave_one_row(backend: str, tmp_path: Path) -> None:
    """Two stores on one file (or database) stand for two processes: the second waits for the
    first's lock, then finds the name taken."""
    where = new_location(backend, tmp_path)
    first, second = await open_at(where), await open_at(where)
    try:
        created = await _project(first)
        pid, main = created.project.id, created.branch

        async def insert(store: Store, started: asyncio.Event | None = None) -> None:
            async with store.write() as tx:
                await tx.insert_branch(_child(main, "pr-1"))
                if started is not None:
                    started.set()
                    await asyncio.sleep(0.2)  # hold the write lock while the other one asks

        started = asyncio.Event()
        winner = asyncio.create_task(insert(first, started))
        await started.wait()
        with pytest.raises(AlreadyExists, match='branch_name:"pr-1"'):
            await insert(second)
        await winner
        async with second.read() as tx:
            assert [b.name for b in await tx.list_branches(pid)].count("pr-1") == 1
    finally:
        await first.close()
        await second.close()


# -- operation pages ----------------------------------------------------------------------------


async def _pages(store: Store, project_id: str, limit: int) -> list[str]:
    seen: list[str] = []
    before = None
    while True:
        async with store.read() as tx:
            page = await tx.list_operations(project_id=project_id, before=before, limit=limit)
        if not page:
            return seen
        seen += [o.id for o in page]
        before = page[-1].created_at


async def test_operations_with_one_timestamp_are_stored_apart_and_paged_exactly(
    store: Store,
) -> None:
    created = await _project(store)
    pid = created.project.id
    latest = created.operations[-1].created_at
    # Five in one transaction, all at the project's latest instant (a clock that did not move);
    # then three from a clock that went back.
    async with store.write() as tx:
        tied = await tx.insert_operations([finished_operation(pid, latest) for _ in range(5)])
    async with store.write() as tx:
        earlier = await tx.insert_operations(
            [finished_operation(pid, latest - 1_000_000) for _ in range(3)]
        )
    stamps = [o.created_at for o in [*created.operations, *tied, *earlier]]
    assert stamps == sorted(set(stamps))  # unique, and in the order they were written

    everything = [o.id for o in reversed([*created.operations, *tied, *earlier])]
    for limit in (1, 2, 3, 10):
        assert await _pages(store, pid, limit) == everything, limit

    # Forcing a tie past the store's method is refused by the page index itself.
    with pytest.raises(UNIQUE_ERRORS, match=r"(?i)unique|duplicate"):
        raw_sql(
            store,
            "INSERT INTO operations (id, project_id, action, status, failures_count,"
            " created_at, updated_at, total_duration_ms)"
            " VALUES ('x', ?, 'apply_config', 'finished', 0, ?, ?, 0)",
            (pid, tied[0].created_at, tied[0].created_at),
        )


async def test_endpoint_activity_only_moves_forward(store: Store) -> None:
    created = await _project(store)
    pid, eid = created.project.id, created.endpoint.id
    async with store.write() as tx:
        await tx.record_endpoint_activity([(eid, 2_000), ("ep-gone", 1)])
        await tx.record_endpoint_activity([(eid, 1_000)])
    async with store.read() as tx:
        endpoint = await tx.get_endpoint(project_id=pid, endpoint_id=eid)
    assert endpoint is not None
    assert endpoint.last_active == 2_000


async def test_an_account_renamed_keeps_its_id_and_never_takes_anothers_email(
    store: Store,
) -> None:
    async with store.write() as tx:
        first = await accounts.ensure(tx, email=accounts.HEADLESS)
        other = await accounts.ensure(tx, email="taken@example.com")
        await tx.rename_account(account_id=first.id, email="me@example.com", name="me")
    async with store.read() as tx:
        renamed = await tx.get_account_by_email("me@example.com")
        assert await tx.get_account_by_email(accounts.HEADLESS) is None
    assert renamed is not None and (renamed.id, renamed.name) == (first.id, "me")
    with pytest.raises(Conflict):
        async with store.write() as tx:
            await tx.rename_account(account_id=first.id, email=other.email, name="x")
    async with store.read() as tx:
        assert (await tx.get_account(first.id)) == renamed


async def test_a_project_search_matches_names_in_any_case_and_ids_literally(
    store: Store,
) -> None:
    names = ["Shop_prod", "shop-staging", "other 100%", "shopXprod"]
    made = []
    for name in names:
        created = await _project(store)
        async with store.write() as tx:
            renamed = msgspec.structs.replace(created.project, name=name)
            await tx.update_project(renamed)
        made.append(renamed)
    account = made[0].account_id

    async def found(search: str, after: str | None = None) -> list[str]:
        async with store.read() as tx:
            page = await tx.list_projects(
                account_id=account, after_id=after, limit=10, search=search
            )
        return [p.name for p in page]

    assert await found("SHOP") == ["shopXprod", "shop-staging", "Shop_prod"]
    assert await found("p_p") == ["Shop_prod"]  # "_" is a character, not LIKE's any one
    assert await found("100%") == ["other 100%"]
    assert await found(made[1].id[-8:]) == ["shop-staging"]
    assert await found("shop", after=made[3].id) == ["shop-staging", "Shop_prod"]  # paged
    assert await found("nothing") == []


async def test_a_snapshot_slug_is_held_once_among_live_snapshots(store: Store) -> None:
    created = await _project(store)
    pid, main = created.project.id, created.branch

    def taken(slug: str) -> Snapshot:
        now = clock.now_us()
        return Snapshot(
            id=ids.new_snapshot_id(), project_id=pid, source_branch_id=main.id, name=slug,
            state="ready", manual=True, roles=[], databases=[], created_at=now, updated_at=now,
            slug=slug,
        )  # fmt: skip

    first = taken("before-migration")
    async with store.write() as tx:
        await tx.insert_snapshot(first)
        assert await tx.snapshot_slug_taken(project_id=pid, slug="before-migration")
    with pytest.raises(Conflict, match="slug 'before-migration' is taken"):
        async with store.write() as tx:
            await tx.insert_snapshot(taken("before-migration"))
    # Another project's, or a deleted snapshot's, slug is free.
    other = await _project(store)
    async with store.write() as tx:
        await tx.insert_snapshot(
            msgspec.structs.replace(taken("before-migration"), project_id=other.project.id)
        )
        await tx.update_snapshot(msgspec.structs.replace(first, deleted_at=clock.now_us()))
        assert not await tx.snapshot_slug_taken(project_id=pid, slug="before-migration")
        await tx.insert_snapshot(taken("before-migration"))
    async with store.read() as tx:
        (live,) = await tx.list_snapshots(pid)
    assert live.slug == "before-migration" and live.id != first.id


async def test_an_up_to_date_store_opens_while_another_process_writes(tmp_path: Path) -> None:
    """Its schema is seen current by a read: a CLI command opens the store a busy ``serve``
    is writing and waits for the lock where it says so, not inside the migration."""
    path = tmp_path / "s.db"
    await SqliteStore(path).close()  # migrated
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        store = SqliteStore(path, busy_seconds=0.1)  # would have failed: "database is locked"
        try:
            async with store.read() as tx:
                assert await tx.list_accounts() == []
        finally:
            await store.close()
        holder.execute("ROLLBACK")
