"""What the store answers from what it keeps (SQLite's reader: ``store/sqlite/memo.py``) never
outlives a change: a key revoked or an operation added, through the store or by another program,
shows at the next request. On both backends: PostgreSQL keeps nothing, and must agree.

A request is served in a turn of the event loop after the one its bytes were read in, so "the
next request" is a read after a turn has passed (``_next_request``)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from pgplane.config import Settings
from pgplane.core.models import ApiKey
from pgplane.errors import Unavailable
from pgplane.services import accounts, api_keys, projects
from pgplane.services.api_keys import CreatedKey
from pgplane.store import Store
from pgplane.store.sqlite import SqliteStore
from pgplane.store.sqlite.memo import MAX_ROWS
from tests.stores import raw_sql
from tests.support import finished_operation, no_pg_settings


@pytest.fixture
def store(any_store: Store) -> Store:
    return any_store


async def _next_request() -> None:
    await asyncio.sleep(0)


async def _key(store: Store) -> tuple[str, CreatedKey]:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="memo@example.com")
        created = await api_keys.create(tx, account_id=account.id, name="k", created_by=account.id)
    return account.id, created


async def _authenticated(store: Store, value: str) -> ApiKey | None:
    async with store.read() as tx:
        return await api_keys.authenticate(tx, value=value)


async def test_a_key_revoked_through_the_store_fails_at_the_next_lookup(store: Store) -> None:
    account_id, created = await _key(store)
    for _ in range(3):
        assert await _authenticated(store, created.value) is not None
    async with store.write() as tx:
        await api_keys.revoke(tx, account_id=account_id, key_id=created.key.id)
    assert await _authenticated(store, created.value) is None


async def test_a_key_revoked_by_another_program_fails_at_the_next_lookup(store: Store) -> None:
    """As ``pgplane api-keys revoke`` does, from another process, while the server runs."""
    _, created = await _key(store)
    for _ in range(3):
        assert await _authenticated(store, created.value) is not None
    raw_sql(store, "UPDATE api_keys SET revoked_at = 1 WHERE id = ?", (created.key.id,))
    await _next_request()
    assert await _authenticated(store, created.value) is None


async def test_a_page_shows_the_operations_added_since_it_was_read(store: Store) -> None:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="memo@example.com")
        created = await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(pg_versions=(16,), compute_ports=(45000, 45999)),
            check_settings=no_pg_settings,
        )
    pid = created.project.id

    async def newest() -> str:
        async with store.read() as tx:
            page = await tx.list_operations(
                project_id=pid, before=None, limit=10, account_id=account.id
            )
        page.clear()  # what the caller does with its list is its own business
        async with store.read() as tx:
            page = await tx.list_operations(
                project_id=pid, before=None, limit=10, account_id=account.id
            )
        return page[0].id

    first = await newest()
    async with store.write() as tx:
        (added,) = await tx.insert_operations(
            [finished_operation(pid, created.operations[-1].created_at + 1)]
        )
    assert await newest() == added.id != first
    raw_sql(store, "DELETE FROM operations WHERE id = ?", (added.id,))
    await _next_request()
    assert await newest() == first


async def test_sqlite_answers_a_repeated_read_from_what_it_keeps(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "s.db")
    try:
        _, created = await _key(store)
        statements: list[str] = []
        store._reader.set_trace_callback(statements.append)  # the statements the reader runs
        for _ in range(2):  # two turns of the loop, three requests in each
            for _ in range(3):
                assert await _authenticated(store, created.value) is not None
            await _next_request()
        assert sum("FROM api_keys" in s for s in statements) == 1
        assert sum(s == "PRAGMA data_version" for s in statements) == 2  # one look a turn
    finally:
        await store.close()


async def test_sqlite_sees_its_own_writers_commit_within_the_turn(tmp_path: Path) -> None:
    """A write committed by this process is seen by the reads that follow it in the same turn,
    before the reader's next look at the store's counter: the commit drops what was kept."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        account_id, created = await _key(store)
        assert await _authenticated(store, created.value) is not None
        kept = store._memo._answers  # the kept answers themselves, not a fresh look
        assert kept
        async with store.write() as tx:
            await api_keys.revoke(tx, account_id=account_id, key_id=created.key.id)
        assert not kept
        assert await _authenticated(store, created.value) is None
    finally:
        await store.close()


async def test_sqlite_reader_never_writes(tmp_path: Path) -> None:
    """A write sent through ``read()`` would change the store without moving the counter the
    kept answers are checked against: refused, as any fault of the store is."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        with pytest.raises(Unavailable):
            async with store.read() as tx:
                await tx.record_endpoint_activity([("ep-x", 1)])
        with sqlite3.connect(store.path) as db:  # the file itself is writable, by others
            db.execute("INSERT INTO health (id, checked_at) VALUES (1, 1)")
    finally:
        await store.close()


async def test_what_is_kept_is_bounded_in_rows(tmp_path: Path) -> None:
    """A page may hold a thousand operations: what is kept is counted in rows, not answers."""
    store = SqliteStore(tmp_path / "s.db")
    try:
        memo = store._memo
        memo.current()
        for n in range(MAX_ROWS // 1000):
            memo.keep(("page", n), (), 1000)
        assert len(memo.current()) == MAX_ROWS // 1000
        memo.keep(("page", "one more"), (), 1000)
        assert list(memo.current()) == [("page", "one more")]
    finally:
        await store.close()
