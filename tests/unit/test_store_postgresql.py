"""What the PostgreSQL store does beyond the shared statements: claims that skip a row another
transaction holds, new work announced to other processes, faults as 503s, and the translation of
SQLite's placeholders."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.core.operations import Status
from pgplane.errors import BadRequest, Unavailable
from pgplane.services import accounts, projects
from pgplane.store.postgresql import PostgresStore
from pgplane.store.postgresql.conn import translate
from pgplane.store.postgresql.tx import PgTx
from tests.pgstore import store_cluster
from tests.support import finished_operation, free_port, no_pg_settings


@pytest.fixture
async def two() -> AsyncIterator[tuple[PostgresStore, PostgresStore]]:
    """Two stores on one database: two processes of one platform."""
    url = store_cluster().database()
    first = await PostgresStore.open(url)
    second = await PostgresStore.open(url)
    yield first, second
    await first.close()
    await second.close()


async def _queued(store: PostgresStore) -> Operation:
    """A project whose first operation waits to be claimed."""
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="claims@example.com")
        created = await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(pg_versions=(16,), compute_ports=(45000, 45999)),
            check_settings=no_pg_settings,
        )
    return created.operations[0]


async def test_two_processes_claiming_one_operation_run_it_once(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    seen = await _queued(first)
    now = clock.now_us()

    async def claim(store: PostgresStore, owner: str) -> Operation | None:
        async with store.write() as tx:
            return await tx.claim_operation(
                seen=seen, owner=owner, now=now, lease_until=now + 10**6, failed_attempt=False
            )

    won = await asyncio.gather(*(claim(s, f"w{i}") for i, s in enumerate([first, second] * 4)))
    assert len([c for c in won if c is not None]) == 1


async def test_a_claim_skips_an_operation_another_transaction_holds(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    seen = await _queued(first)
    now = clock.now_us()
    holding, release = asyncio.Event(), asyncio.Event()

    async def hold() -> None:  # another node's claim of it, not committed yet
        async with first.write() as tx:
            assert isinstance(tx, PgTx)
            await tx.conn.execute("SELECT 1 FROM operations WHERE id = ? FOR UPDATE", (seen.id,))
            holding.set()
            await release.wait()

    held = asyncio.create_task(hold())
    await holding.wait()
    try:
        async with asyncio.timeout(2):  # far below the lock timeout: it does not wait
            async with second.write() as tx:
                claimed = await tx.claim_operation(
                    seen=seen, owner="w", now=now, lease_until=now + 10**6, failed_attempt=False
                )
        assert claimed is None
    finally:
        release.set()
        await held
    async with second.write() as tx:  # once released, it is there to claim
        claimed = await tx.claim_operation(
            seen=seen, owner="w", now=now, lease_until=now + 10**6, failed_attempt=False
        )
    assert claimed is not None
    assert claimed.status is Status.RUNNING
    assert claimed.lease_owner == "w"
    # The first start is kept from the first claim on (total_duration_ms counts from it).
    assert claimed.started_at == now
    later = now + 5_000_000
    async with second.write() as tx:
        again = await tx.claim_operation(
            seen=claimed, owner="w2", now=later, lease_until=later + 10**6, failed_attempt=True
        )
    assert again is not None and again.started_at == now and again.attempt_started_at == later


async def test_new_operations_wake_another_process(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    woken = asyncio.Event()
    watcher = asyncio.create_task(second.watch_operations(woken.set))
    try:
        async with asyncio.timeout(10):
            await woken.wait()  # listening (it wakes once when it starts)
            woken.clear()
            seen = await _queued(first)
            await woken.wait()
            woken.clear()
            # Settled by its owner: what waits behind it may run, on any node.
            now = clock.now_us()
            async with first.write() as tx:
                claimed = await tx.claim_operation(
                    seen=seen, owner="w", now=now, lease_until=now + 10**6, failed_attempt=False
                )
            assert claimed is not None
            async with first.write() as tx:
                done = msgspec.structs.replace(claimed, status=Status.FINISHED, lease_owner=None)
                assert await tx.update_owned_operation(done, owner="w")
            await woken.wait()
        # A transaction that queued nothing announces nothing.
        woken.clear()
        async with first.write() as tx:
            await tx.record_endpoint_activity([])
        await asyncio.sleep(0.3)  # a NOTIFY would have arrived by now (it is local)
        assert not woken.is_set()
    finally:
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher


async def test_operations_of_one_instant_stay_ordered_across_processes(
    two: tuple[PostgresStore, PostgresStore],
) -> None:
    first, second = two
    seen = await _queued(first)
    at = seen.created_at

    async def insert(store: PostgresStore) -> list[Operation]:
        async with store.write() as tx:
            return await tx.insert_operations(
                [finished_operation(seen.project_id, at) for _ in range(3)]
            )

    batches = await asyncio.gather(*(insert(s) for s in [first, second] * 3))
    stamps = sorted(o.created_at for batch in batches for o in batch)
    assert len(set(stamps)) == len(stamps) == 18
    assert stamps[0] > at


async def test_an_unreachable_store_is_a_503() -> None:
    with pytest.raises(Unavailable) as raised:
        await PostgresStore.open(f"postgresql://nobody@127.0.0.1:{free_port()}/none")
    assert raised.value.status == 503
    store = await PostgresStore.open(store_cluster().database())
    await store.probe()
    await store.close()


def test_placeholders_are_translated_once_and_literals_left_alone() -> None:
    assert translate("SELECT ? , ?") == "SELECT $1 , $2"
    assert translate("WHERE a = ?2 AND b = ?1 AND c = ?") == "WHERE a = $2 AND b = $1 AND c = $3"
    assert translate("WHERE x IS ? AND y = '?' AND z = 'it''s ?'") == (
        "WHERE x IS NOT DISTINCT FROM $1 AND y = '?' AND z = 'it''s ?'"
    )
    assert translate("VALUES (?1, ?2, ?3, ?3)") == "VALUES ($1, $2, $3, $3)"


async def test_a_nul_character_is_the_clients_error_not_a_500() -> None:
    """PostgreSQL's text cannot hold NUL; SQLite's can. Names refuse control characters before
    the store; any other field a client sets ends here as a 400."""
    store = await PostgresStore.open(store_cluster().database())

    async def write() -> None:
        async with store.write() as tx:
            account = await accounts.ensure(tx, email="nul@example.com")
            await tx.insert_api_key(
                account_id=account.id,
                name="a\x00b",
                digest="d",
                created_at=clock.now_us(),
                created_by=account.id,
            )

    try:
        with pytest.raises(BadRequest, match="NUL"):
            await write()
        async with store.read() as tx:  # nothing of it was kept
            assert await tx.get_account_by_email("nul@example.com") is None
    finally:
        await store.close()
