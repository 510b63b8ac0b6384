"""Checking a presented key: what reaches the store (scenario A1: malformed keys never do), and
recording its uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgplane.core import keys
from pgplane.errors import Unavailable
from pgplane.services import accounts, api_keys
from pgplane.store.sqlite import SqliteStore


class CountingTx:
    """A store transaction that records key lookups and fails on anything else."""

    def __init__(self) -> None:
        self.lookups: list[str] = []

    async def get_api_key_by_digest(self, digest: str) -> None:
        self.lookups.append(digest)

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected store call: {name}")


def _wrong_checksum() -> str:
    value = keys.generate()
    return value[:-1] + ("A" if value[-1] != "A" else "B")


@pytest.mark.parametrize(
    "value",
    [
        "",
        "not-a-key",
        "x" * 64,
        "pgp_" + "A" * 60,
        _wrong_checksum(),
        keys.generate()[:-1],
        keys.generate() + "A",
        keys.generate().replace("pgp_", "pgq_"),
        keys.generate()[:10] + "é" + keys.generate()[11:],
    ],
    # Named by length: the generated values differ in every process that collects them.
    ids=lambda value: f"{len(value)}-chars",
)
async def test_malformed_keys_never_reach_the_store(value: str) -> None:
    tx = CountingTx()
    assert await api_keys.authenticate(tx, value=value) is None  # type: ignore[arg-type]
    assert tx.lookups == []


async def test_a_well_formed_key_is_looked_up_once_by_its_digest() -> None:
    tx, value = CountingTx(), keys.generate()
    assert await api_keys.authenticate(tx, value=value) is None  # type: ignore[arg-type]
    assert tx.lookups == [keys.digest(value)]


async def test_key_uses_whose_write_failed_are_written_by_the_next_flush(tmp_path: Path) -> None:
    """A flush whose transaction does not commit (the store's disk full) loses no use."""
    store = SqliteStore(tmp_path / "store.db")
    try:
        async with store.write() as tx:
            account = await accounts.ensure(tx, email="uses@example.com")
            created = await api_keys.create(
                tx, account_id=account.id, name="k", created_by=account.id
            )
        key_id = created.key.id
        recorder = api_keys.UseRecorder()
        recorder.record(key_id, "10.0.0.1")

        async def flush_not_committed() -> None:
            async with store.write() as tx:
                await recorder.flush(tx)
                raise Unavailable("the commit failed")

        with pytest.raises(Unavailable):
            await flush_not_committed()
        assert recorder.has_pending()

        async with store.write() as tx:
            batch = await recorder.flush(tx)
        recorder.record(key_id, "10.0.0.2")  # used again before the commit was acknowledged
        recorder.written(batch)
        assert recorder.has_pending()  # the newer use still waits for its flush
        async with store.read() as tx:
            (key,) = await tx.list_api_keys(account.id)
        assert key.last_used_from_addr == "10.0.0.1"
        assert key.last_used_at is not None
    finally:
        await store.close()
