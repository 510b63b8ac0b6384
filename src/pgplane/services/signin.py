"""Signing in to the console: passwords, sessions, one-time sign-up links.

Passwords are hashed with argon2id (argon2-cffi's defaults: RFC 9106's second recommended
option, 64 MiB of memory). Hashing takes tens of milliseconds of CPU on purpose, so callers do
it off the event loop (:func:`hash_password`, :func:`password_matches`) and before opening a
write transaction, never inside one.

A session is a random token in a cookie; the store keeps its SHA-256 digest only, so a copy of
the store signs nobody in. Each session has its own CSRF token, which every form of the console
carries and every unsafe request must echo. Sign-up links carry a one-time token, stored the
same way: the first account's link is printed by ``serve``, later ones by
``pgplane accounts invite``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

import msgspec
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from pgplane.core import clock
from pgplane.core.models import Account, ConsoleSession, SignupToken
from pgplane.errors import BadRequest, Conflict, Unauthorized
from pgplane.services import accounts
from pgplane.store import Tx

MIN_PASSWORD = 10
MAX_PASSWORD = 1024  # argon2 takes any length; a megabyte of "password" is an attack
MAX_EMAIL = 254
SESSION_SECONDS = 14 * 86_400
SIGNUP_SECONDS = 7 * 86_400
_US = 1_000_000
# Local part, @, a domain with a dot: what a sign-in form can check; the rest is the mail's job.
_EMAIL = re.compile(r"^[^@\s\x00-\x1f\x7f]+@[^@\s\x00-\x1f\x7f]+\.[^@\s\x00-\x1f\x7f]+$")

_hasher = PasswordHasher()


@functools.cache
def _dummy_hash() -> str:
    """Verified when an email has no password, so that a wrong email costs what a wrong password
    does (no timing tells which emails have accounts). Made at its first use, in a thread: made
    at import it cost every process that imports this (the server, each CLI command) 0.12 s."""
    return _hasher.hash(secrets.token_hex(16))


def _verify(password_hash: str | None, password: str) -> bool:
    return _hasher.verify(password_hash or _dummy_hash(), password)


def email(value: str) -> str:
    value = value.strip()
    if len(value) > MAX_EMAIL or _EMAIL.match(value) is None:
        raise BadRequest("enter an email address, like you@example.com")
    return value.lower()


def check_password(value: str) -> str:
    if len(value) < MIN_PASSWORD:
        raise BadRequest(f"the password must have at least {MIN_PASSWORD} characters")
    if len(value) > MAX_PASSWORD:
        raise BadRequest(f"the password must have at most {MAX_PASSWORD} characters")
    return value


async def hash_password(password: str) -> str:
    """The argon2id hash of a checked password, computed off the event loop."""
    return await asyncio.to_thread(_hasher.hash, check_password(password))


async def password_matches(password_hash: str | None, password: str) -> bool:
    if len(password) > MAX_PASSWORD:
        return False
    try:
        return await asyncio.to_thread(_verify, password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def same(a: str, b: str) -> bool:
    """Compare secrets in constant time."""
    return hmac.compare_digest(a.encode(), b.encode())


@dataclass(frozen=True, slots=True)
class NewSession:
    session: ConsoleSession
    token: str  # the cookie's value: given to the browser once, never stored


async def start_session(tx: Tx, *, account_id: str) -> NewSession:
    """A fresh session (a new token at every sign-in: a token planted before it is worthless)."""
    token = secrets.token_urlsafe(32)
    now = clock.now_us()
    session = ConsoleSession(
        digest=digest(token),
        account_id=account_id,
        csrf_token=secrets.token_urlsafe(32),
        created_at=now,
        expires_at=now + SESSION_SECONDS * _US,
    )
    await tx.insert_console_session(session)
    return NewSession(session=session, token=token)


async def session(tx: Tx, token: str) -> ConsoleSession | None:
    if not token or len(token) > 128:
        return None
    return await tx.get_console_session(digest(token), now=clock.now_us())


async def end_session(tx: Tx, current: ConsoleSession, *, everywhere: bool = False) -> None:
    await tx.delete_console_sessions(
        account_id=current.account_id, digest=None if everywhere else current.digest
    )


async def account_for_sign_in(tx: Tx, address: str) -> tuple[Account | None, str | None]:
    """The account with this email and its password hash (either may be None)."""
    account = await tx.get_account_by_email(address)
    if account is None:
        return None, None
    return account, await tx.get_password_hash(account.id)


async def new_signup_link(tx: Tx, *, for_email: str | None = None) -> str:
    """A one-time sign-up token (for ``for_email`` only, when given); its value, shown once."""
    token = secrets.token_urlsafe(32)
    now = clock.now_us()
    await tx.insert_signup_token(
        SignupToken(
            digest=digest(token),
            email=None if for_email is None else email(for_email),
            created_at=now,
            expires_at=now + SIGNUP_SECONDS * _US,
            used_at=None,
        )
    )
    return token


_LINK_NOT_VALID = "this sign-up link is not valid: it was used, or it expired"


async def check_signup_link(tx: Tx, *, token: str) -> None:
    """Unauthorized, said before the form is filled in, if the link can no longer be used."""
    if not token or not await tx.valid_signup_token(digest(token), now=clock.now_us()):
        raise Unauthorized(_LINK_NOT_VALID)


async def sign_up(tx: Tx, *, token: str, address: str, password_hash: str) -> Account:
    """Spend the sign-up ``token`` on an account for ``address`` with this password."""
    used = await tx.use_signup_token(digest(token), now=clock.now_us()) if token else None
    if used is None:
        raise Unauthorized(_LINK_NOT_VALID)
    address = email(address)
    if used.email is not None and used.email != address:
        raise BadRequest(f"this invitation is for {used.email}")
    existing = await tx.get_account_by_email(address)
    if existing is not None and await tx.get_password_hash(existing.id) is not None:
        raise Conflict("an account with this email exists: sign in instead")
    account = existing
    if account is None and used.email is None:
        account = await _take_over_headless(tx, address)
    if account is None:
        account = await accounts.ensure(tx, email=address)
    await tx.set_password_hash(account_id=account.id, password_hash=password_hash)
    return account


async def _take_over_headless(tx: Tx, address: str) -> Account | None:
    """The first person to sign up on a platform set up from the command line: the account
    its first API key made (``accounts.HEADLESS``, which signs in nowhere) becomes theirs,
    under their email, with its keys and projects, rather than a second, empty one beside it.
    Only while nobody can sign in yet; None when there is no such account to take."""
    if await tx.count_accounts_with_password() > 0:
        return None
    headless = await tx.get_account_by_email(accounts.HEADLESS)
    if headless is None:
        return None
    name = accounts.name_of(address)
    await tx.rename_account(account_id=headless.id, email=address, name=name)
    return msgspec.structs.replace(headless, email=address, name=name)


async def set_password(tx: Tx, *, address: str, password_hash: str) -> Account:
    """The CLI's ``accounts create``: the account (made if new) gets this password."""
    account = await accounts.ensure(tx, email=email(address))
    await tx.set_password_hash(account_id=account.id, password_hash=password_hash)
    await tx.delete_console_sessions(account_id=account.id)  # a new password ends old sessions
    return account
