"""Readiness: the store's probe and the watched tasks, one check at a time; a damaged store is a
503, never a 500."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pgplane.api.health import Readiness
from pgplane.errors import Unavailable
from pgplane.store.sqlite import SqliteStore


class CountingStore(SqliteStore):
    probes = 0

    async def probe(self) -> None:
        self.probes += 1
        await asyncio.sleep(0.01)  # long enough for every concurrent check to find it running
        await super().probe()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CountingStore]:
    s = CountingStore(tmp_path / "store.db")
    yield s
    await s.close()


async def test_a_store_that_reads_and_writes_is_ready(store: CountingStore) -> None:
    readiness = Readiness(store)
    assert await readiness.check() == {"store": "ok"}
    with contextlib.closing(sqlite3.connect(store.path)) as db:  # the heartbeat was committed
        assert db.execute("SELECT count(*) FROM health").fetchone() == (1,)


async def test_a_flood_of_probes_runs_one_check(store: CountingStore) -> None:
    readiness = Readiness(store)
    answers = await asyncio.gather(*(readiness.check() for _ in range(50)))
    assert answers == [{"store": "ok"}] * 50
    assert await readiness.check() == {"store": "ok"}  # within REUSE_SECONDS: the same answer
    assert store.probes == 1


async def test_a_stopped_task_is_not_ready_and_says_why(store: CountingStore) -> None:
    async def crashes() -> None:
        raise RuntimeError("boom")

    readiness = Readiness(store)
    running = asyncio.create_task(asyncio.Event().wait())
    crashed = asyncio.create_task(crashes())
    await asyncio.wait({crashed})
    readiness.watch("scheduler", running)  # type: ignore[arg-type]
    readiness.watch("operations", crashed)
    with pytest.raises(Unavailable) as refused:
        await readiness.check()
    assert refused.value.message == "not ready: operations: stopped (RuntimeError: boom)"
    assert refused.value.headers == {"Retry-After": "1"}
    running.cancel()


async def test_a_damaged_store_is_unavailable_not_a_bug(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    await SqliteStore(path).close()  # migrated, and checkpointed into the file on close
    store = SqliteStore(path)
    try:
        # Every page past the header overwritten, as a failing disk or a stray writer would.
        size, page = path.stat().st_size, 4096
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, b"\xa5" * (size - page), page)
        finally:
            os.close(fd)
        with pytest.raises(Unavailable, match="malformed"):
            async with store.read() as tx:
                await tx.list_projects(account_id="a", after_id=None, limit=10)
        with pytest.raises(Unavailable, match="malformed"):
            await store.probe()
        with pytest.raises(Unavailable, match=r"not ready: store: .*malformed"):
            await Readiness(store).check()
    finally:
        await store.close()
