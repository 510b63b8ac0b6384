"""Expiring branches: which branches may expire, and when.

Neon's rules, kept whole: ``expires_at`` is an RFC 3339 time in the future and at most 30 days
ahead, kept to the second; ``ttl_interval_seconds`` (read-only) is how far ahead it was when
set, and a restore counts it again from the restore. The default branch, a protected branch and
a branch with children cannot expire, and, the other way round, an expiring branch cannot be
protected, made the default or branched from: each such request is a 400 that says why. So the
platform never has to choose between deleting such a branch and missing its time: when a branch
is due, the scheduler deletes it as a DELETE would (see :func:`pgplane.services.scheduled.expire`).
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.models import Branch
from pgplane.errors import BadRequest
from pgplane.services import history

FIELD = "expires_at"
MAX_SECONDS = 30 * 86_400  # Neon's limit: 30 days from now
_US = 1_000_000


def parse(text: str) -> int:
    """An RFC 3339 time, in us, cut to the second (as Neon keeps it); a 400 naming the field."""
    return history.parse_time(text, FIELD) // _US * _US


def _check_time(expires_at: int, now: int) -> None:
    if expires_at <= now:
        raise BadRequest(
            f"{FIELD} must be in the future: {clock.format_s(expires_at)} has passed"
            f" (it is {clock.format_s(now)})"
        )
    if expires_at - now > MAX_SECONDS * _US:
        raise BadRequest(
            f"{FIELD} must be at most 30 days ahead, by {clock.format_s(now + MAX_SECONDS * _US)};"
            f" {clock.format_s(expires_at)} is later"
        )


def why_not(branch: Branch, *, has_children: bool) -> str | None:
    """Why ``branch`` cannot expire, or None when it can."""
    if branch.default:
        return "the default branch cannot expire"
    if branch.protected:
        return "a protected branch cannot expire; unprotect it first"
    if has_children:
        return "a branch with child branches cannot expire; delete them first"
    return None


def expiring(branch: Branch, expires_at: int | None, *, has_children: bool, now: int) -> Branch:
    """``branch`` with ``expires_at`` set (its interval counted from ``now``) or cleared (None)."""
    if expires_at is None:
        return msgspec.structs.replace(branch, expires_at=None, ttl_interval_seconds=None)
    _check_time(expires_at, now)
    reason = why_not(branch, has_children=has_children)
    if reason is not None:
        raise BadRequest(f"{FIELD}: {reason}")
    return msgspec.structs.replace(
        branch,
        expires_at=expires_at,
        ttl_interval_seconds=(expires_at - now + _US // 2) // _US,
    )


def refuse_if_expiring(branch: Branch, what: str, *, field: str | None = None) -> None:
    """A 400 (naming ``field``) when ``branch`` expires: ``what`` would keep it from expiring."""
    if branch.expires_at is not None:
        prefix = f"{field}: " if field else ""
        raise BadRequest(
            f"{prefix}branch {branch.id} expires at {clock.format_s(branch.expires_at)}, and"
            f" {what}; clear its {FIELD} first"
        )


def restarted(branch: Branch, now: int) -> Branch:
    """After a restore, the countdown starts again from ``now`` with the same interval."""
    if branch.ttl_interval_seconds is None or branch.expires_at is None:
        return branch
    return msgspec.structs.replace(
        branch, expires_at=now // _US * _US + branch.ttl_interval_seconds * _US
    )
