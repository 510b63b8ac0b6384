"""Accounts: every object belongs to one."""

from __future__ import annotations

from pgplane.core import clock, ids
from pgplane.core.models import Account
from pgplane.store import Tx

# The account an API key made on the command line belongs to on a platform that has none yet:
# it signs in nowhere, and the first person to sign up with the link ``serve`` prints takes it
# over (services/signin.py), keys and projects with it.
HEADLESS = "admin@localhost"


def name_of(email: str) -> str:
    return email.split("@", 1)[0]


async def ensure(tx: Tx, *, email: str) -> Account:
    """The account with this email, created if it does not exist."""
    existing = await tx.get_account_by_email(email)
    if existing is not None:
        return existing
    account = Account(
        id=ids.new_account_id(), email=email, name=name_of(email), created_at=clock.now_us()
    )
    await tx.insert_account(account)
    return account
