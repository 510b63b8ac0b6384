"""Accounts and their API keys."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from pgplane.core.models import Account, ApiKey
from pgplane.errors import AlreadyExists, Conflict
from pgplane.store.sqlite.common import Statements

_KEY_COLUMNS = (
    "id, account_id, name, digest, created_at, created_by, last_used_at, last_used_from_addr,"
    " revoked_at"
)


_KEY_BY_DIGEST = f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE digest = ?"


def _api_key(r: Sequence[Any]) -> ApiKey:
    return ApiKey(
        id=r[0],
        account_id=r[1],
        name=r[2],
        digest=r[3],
        created_at=r[4],
        created_by=r[5],
        last_used_at=r[6],
        last_used_from_addr=r[7],
        revoked_at=r[8],
    )


class AccountsMixin(Statements):
    """The account part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def get_account(self, account_id: str) -> Account | None:
        r = await self._c.one(
            "SELECT id, email, name, created_at FROM accounts WHERE id = ?", (account_id,)
        )
        return Account(id=r[0], email=r[1], name=r[2], created_at=r[3]) if r else None

    async def get_account_by_email(self, email: str) -> Account | None:
        r = await self._c.one(
            "SELECT id, email, name, created_at FROM accounts WHERE email = ?", (email,)
        )
        return Account(id=r[0], email=r[1], name=r[2], created_at=r[3]) if r else None

    async def list_accounts(self) -> list[tuple[Account, bool]]:
        rows = await self._c.all(
            "SELECT id, email, name, created_at, password_hash IS NOT NULL FROM accounts"
            " ORDER BY created_at, id"
        )
        return [
            (Account(id=r[0], email=r[1], name=r[2], created_at=r[3]), bool(r[4])) for r in rows
        ]

    async def rename_account(self, *, account_id: str, email: str, name: str) -> None:
        await self._c.write(
            "UPDATE accounts SET email = ?, name = ? WHERE id = ?",
            (email, name, account_id),
            AlreadyExists("account", "an account with this email exists"),
        )

    async def insert_account(self, account: Account) -> None:
        await self._c.write(
            "INSERT INTO accounts (id, email, name, created_at) VALUES (?, ?, ?, ?)",
            (account.id, account.email, account.name, account.created_at),
            AlreadyExists("account", "account already exists"),
        )


class ApiKeysMixin(Statements):
    """The API-key part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def insert_api_key(
        self, *, account_id: str, name: str, digest: str, created_at: int, created_by: str
    ) -> ApiKey:
        row = await self._c.write_one(
            "INSERT INTO api_keys (account_id, name, digest, created_at, created_by)"
            " VALUES (?, ?, ?, ?, ?) RETURNING id",
            (account_id, name, digest, created_at, created_by),
            Conflict("API key already exists"),
        )
        return ApiKey(
            id=row[0],
            account_id=account_id,
            name=name,
            digest=digest,
            created_at=created_at,
            created_by=created_by,
            last_used_at=None,
            last_used_from_addr="",
            revoked_at=None,
        )

    async def get_api_key_by_digest(self, digest: str) -> ApiKey | None:
        memo = self._memo
        asked = ("api_key", digest)
        if memo is not None and (kept := memo.current().get(asked)) is not None:
            return cast("ApiKey", kept)
        r = await self._c.one(_KEY_BY_DIGEST, (digest,))
        if r is None:
            return None
        key = _api_key(r)
        if memo is not None:
            memo.keep(asked, key)
        return key

    async def list_api_keys(self, account_id: str) -> list[ApiKey]:
        rows = await self._c.all(
            f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = ? AND revoked_at IS NULL"
            " ORDER BY id DESC",
            (account_id,),
        )
        return [_api_key(r) for r in rows]

    async def revoke_api_key(self, *, account_id: str, key_id: int, now: int) -> ApiKey | None:
        r = await self._c.one(
            f"UPDATE api_keys SET revoked_at = ? WHERE id = ? AND account_id = ?"
            f" AND revoked_at IS NULL RETURNING {_KEY_COLUMNS}",
            (now, key_id, account_id),
        )
        return _api_key(r) if r else None

    async def record_api_key_use(self, uses: Sequence[tuple[int, int, str]]) -> None:
        await self._c.executemany(
            "UPDATE api_keys SET last_used_at = ?2, last_used_from_addr = ?3"
            " WHERE id = ?1 AND (last_used_at IS NULL OR last_used_at < ?2)",
            uses,
        )
