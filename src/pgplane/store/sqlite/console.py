"""The console's sign-in: password hashes, sessions, one-time sign-up tokens."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgplane.core.models import ConsoleSession, SignupToken
from pgplane.errors import Conflict
from pgplane.store.sqlite.common import Statements

_SIGNUP_COLUMNS = "digest, email, created_at, expires_at, used_at"


def _token(r: Sequence[Any]) -> SignupToken:
    return SignupToken(digest=r[0], email=r[1], created_at=r[2], expires_at=r[3], used_at=r[4])


class ConsoleMixin(Statements):
    """The console part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def get_password_hash(self, account_id: str) -> str | None:
        r = await self._c.one("SELECT password_hash FROM accounts WHERE id = ?", (account_id,))
        return r[0] if r else None

    async def set_password_hash(self, *, account_id: str, password_hash: str) -> None:
        await self._c.execute(
            "UPDATE accounts SET password_hash = ? WHERE id = ?", (password_hash, account_id)
        )

    async def count_accounts_with_password(self) -> int:
        r = await self._c.one("SELECT count(*) FROM accounts WHERE password_hash IS NOT NULL")
        return int(r[0])

    async def insert_console_session(self, session: ConsoleSession) -> None:
        await self._c.write(
            "INSERT INTO console_sessions (digest, account_id, csrf_token, created_at, expires_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                session.digest,
                session.account_id,
                session.csrf_token,
                session.created_at,
                session.expires_at,
            ),
            Conflict("session already exists"),
        )

    async def get_console_session(self, digest: str, *, now: int) -> ConsoleSession | None:
        r = await self._c.one(
            "SELECT digest, account_id, csrf_token, created_at, expires_at"
            " FROM console_sessions WHERE digest = ? AND expires_at > ?",
            (digest, now),
        )
        if r is None:
            return None
        return ConsoleSession(
            digest=r[0], account_id=r[1], csrf_token=r[2], created_at=r[3], expires_at=r[4]
        )

    async def delete_console_sessions(self, *, account_id: str, digest: str | None = None) -> None:
        if digest is None:
            await self._c.execute(
                "DELETE FROM console_sessions WHERE account_id = ?", (account_id,)
            )
        else:
            await self._c.execute(
                "DELETE FROM console_sessions WHERE account_id = ? AND digest = ?",
                (account_id, digest),
            )

    async def insert_signup_token(self, token: SignupToken) -> None:
        await self._c.write(
            f"INSERT INTO signup_tokens ({_SIGNUP_COLUMNS}) VALUES (?, ?, ?, ?, ?)",
            (token.digest, token.email, token.created_at, token.expires_at, token.used_at),
            Conflict("sign-up token already exists"),
        )

    async def valid_signup_token(self, digest: str, *, now: int) -> bool:
        r = await self._c.one(
            "SELECT 1 FROM signup_tokens WHERE digest = ? AND used_at IS NULL AND expires_at > ?",
            (digest, now),
        )
        return r is not None

    async def use_signup_token(self, digest: str, *, now: int) -> SignupToken | None:
        # Inside a write transaction (BEGIN IMMEDIATE): nothing else writes between the two.
        r = await self._c.one(
            f"SELECT {_SIGNUP_COLUMNS} FROM signup_tokens"
            " WHERE digest = ? AND used_at IS NULL AND expires_at > ?",
            (digest, now),
        )
        if r is None:
            return None
        await self._c.execute(
            "UPDATE signup_tokens SET used_at = ? WHERE digest = ?", (now, digest)
        )
        return _token(r)
