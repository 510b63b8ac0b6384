"""Accounts: every object belongs to one."""

from __future__ import annotations

from pgplane.core import clock, ids
from pgplane.core.models import Account
from pgplane.store import Tx


async def ensure(tx: Tx, *, email: str) -> Account:
    """The account with this email, created if it does not exist."""
    existing = await tx.get_account_by_email(email)
    if existing is not None:
        return existing
    account = Account(
        id=ids.new_account_id(), email=email, name=email.split("@", 1)[0], created_at=clock.now_us()
    )
    await tx.insert_account(account)
    return account
