"""The account side of the store contract: accounts, API keys and the console's sign-in.

Part of :class:`pgplane.store.base.Tx`, whose guarantees hold here too: nothing commits on its
own, and a revoked key is seen revoked by every reader as soon as its transaction commits.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from pgplane.core.models import Account, ApiKey, ConsoleSession, SignupToken


class AccountsTx(abc.ABC):
    """Who may use the platform, and with what."""

    # -- accounts -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def get_account(self, account_id: str) -> Account | None: ...

    @abc.abstractmethod
    async def get_account_by_email(self, email: str) -> Account | None: ...

    @abc.abstractmethod
    async def insert_account(self, account: Account) -> None:
        """Insert; a duplicate email raises Conflict."""

    @abc.abstractmethod
    async def rename_account(self, *, account_id: str, email: str, name: str) -> None:
        """A new email (and name) for the account; one another account has raises Conflict."""

    @abc.abstractmethod
    async def list_accounts(self) -> list[tuple[Account, bool]]:
        """Every account, oldest first, with whether it has a console password."""

    # -- API keys -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def insert_api_key(
        self, *, account_id: str, name: str, digest: str, created_at: int, created_by: str
    ) -> ApiKey:
        """Insert a key; the store assigns its integer id."""

    @abc.abstractmethod
    async def get_api_key_by_digest(self, digest: str) -> ApiKey | None:
        """The key with this digest, revoked or not (the caller decides)."""

    @abc.abstractmethod
    async def list_api_keys(self, account_id: str) -> list[ApiKey]:
        """The account's keys that are not revoked, newest first."""

    @abc.abstractmethod
    async def revoke_api_key(self, *, account_id: str, key_id: int, now: int) -> ApiKey | None:
        """Revoke atomically; None if no such unrevoked key belongs to the account."""

    @abc.abstractmethod
    async def record_api_key_use(self, uses: Sequence[tuple[int, int, str]]) -> None:
        """Record ``(key_id, used_at, address)`` for each key, keeping the latest use."""

    # -- the console's sign-in ------------------------------------------------------------------

    @abc.abstractmethod
    async def get_password_hash(self, account_id: str) -> str | None:
        """The account's password hash; None if it has none (keys only, from the CLI)."""

    @abc.abstractmethod
    async def set_password_hash(self, *, account_id: str, password_hash: str) -> None: ...

    @abc.abstractmethod
    async def count_accounts_with_password(self) -> int: ...

    @abc.abstractmethod
    async def insert_console_session(self, session: ConsoleSession) -> None: ...

    @abc.abstractmethod
    async def get_console_session(self, digest: str, *, now: int) -> ConsoleSession | None:
        """The session with this digest unless it has expired."""

    @abc.abstractmethod
    async def delete_console_sessions(self, *, account_id: str, digest: str | None = None) -> None:
        """End one session of the account (``digest``), or all of them (None)."""

    @abc.abstractmethod
    async def insert_signup_token(self, token: SignupToken) -> None: ...

    @abc.abstractmethod
    async def valid_signup_token(self, digest: str, *, now: int) -> bool:
        """Whether the token exists, is unused and has not expired (nothing changed)."""

    @abc.abstractmethod
    async def use_signup_token(self, digest: str, *, now: int) -> SignupToken | None:
        """Mark the token used and return it, if it exists, is unused and has not expired;
        else None. Atomic: of two uses of one token, one gets it."""
