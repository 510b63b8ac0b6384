"""Checking a presented key: what reaches the store (scenario A1: malformed keys never do)."""

from __future__ import annotations

from typing import Any

import pytest

from pgplane.core import keys
from pgplane.services import api_keys


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
)
async def test_malformed_keys_never_reach_the_store(value: str) -> None:
    tx = CountingTx()
    assert await api_keys.authenticate(tx, value=value) is None  # type: ignore[arg-type]
    assert tx.lookups == []


async def test_a_well_formed_key_is_looked_up_once_by_its_digest() -> None:
    tx, value = CountingTx(), keys.generate()
    assert await api_keys.authenticate(tx, value=value) is None  # type: ignore[arg-type]
    assert tx.lookups == [keys.digest(value)]
