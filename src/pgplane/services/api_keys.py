"""API keys: created (value shown once), listed, revoked, and checked on every request."""

from __future__ import annotations

from dataclasses import dataclass

from pgplane.core import clock, keys
from pgplane.core.models import ApiKey
from pgplane.errors import NotFound
from pgplane.services import names
from pgplane.store import Tx


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: ApiKey
    value: str  # the secret: returned to the caller once, never stored


async def create(tx: Tx, *, account_id: str, name: str, created_by: str) -> CreatedKey:
    value = keys.generate()
    key = await tx.insert_api_key(
        account_id=account_id,
        name=names.api_key(name),
        digest=keys.digest(value),
        created_at=clock.now_us(),
        created_by=created_by,
    )
    return CreatedKey(key=key, value=value)


async def list_(tx: Tx, *, account_id: str) -> list[ApiKey]:
    return await tx.list_api_keys(account_id)


# Key ids are 64-bit integers in every store; a larger number names no key (and SQLite would
# refuse to bind it).
_MAX_KEY_ID = 2**63 - 1


async def revoke(tx: Tx, *, account_id: str, key_id: int) -> ApiKey:
    """Revoke at once and for good; an unknown, foreign or already revoked key is a 404."""
    key = None
    if 0 < key_id <= _MAX_KEY_ID:
        key = await tx.revoke_api_key(account_id=account_id, key_id=key_id, now=clock.now_us())
    if key is None:
        raise NotFound("API key not found")
    return key


async def authenticate(tx: Tx, *, value: str) -> ApiKey | None:
    """The live key with this value, or None. Malformed values never reach the store."""
    if not keys.is_well_formed(value):
        return None
    key = await tx.get_api_key_by_digest(keys.digest(value))
    if key is None or key.revoked_at is not None:
        return None
    return key


class UseRecorder:
    """Remembers the latest use of each key and writes them in batches.

    Writing ``last_used_at`` on every request would make each read a write; instead uses are kept
    in memory and flushed every few seconds, so a burst costs one update per key.
    """

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, str]] = {}

    def record(self, key_id: int, address: str) -> None:
        self._pending[key_id] = (clock.now_us(), address)

    def has_pending(self) -> bool:
        return bool(self._pending)

    async def flush(self, tx: Tx) -> dict[int, tuple[int, str]]:
        """Write the pending uses in ``tx``; pass what it returns to :meth:`written` once ``tx``
        has committed. Until then they stay pending: a commit that fails (the store's disk full)
        loses none of them, the next flush writes them."""
        batch = dict(self._pending)
        await tx.record_api_key_use([(k, at, addr) for k, (at, addr) in batch.items()])
        return batch

    def written(self, batch: dict[int, tuple[int, str]]) -> None:
        """Forget the uses of a committed flush (a key used again since stays pending)."""
        for key_id, use in batch.items():
            if self._pending.get(key_id) == use:
                del self._pending[key_id]
