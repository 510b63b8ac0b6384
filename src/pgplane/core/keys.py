"""API key values: recognisable, self-checking, stored only as a digest.

A key is 64 characters: the prefix ``pgp_``, 54 random base62 characters from a CSPRNG, and a
6-character base62 checksum (CRC-32 of prefix and body). The prefix makes a leaked key easy to
spot (secret scanners); the checksum lets a mistyped or forged key be rejected before any lookup.
Only the SHA-256 digest of the whole value is ever stored.
"""

from __future__ import annotations

import hashlib
import secrets
import string
import zlib

PREFIX = "pgp_"
KEY_LENGTH = 64
_BODY_LENGTH = 54
_CHECK_LENGTH = 6
_BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
_BASE62_SET = frozenset(_BASE62)


def _base62(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 62)
        out.append(_BASE62[r])
    return "".join(reversed(out))


def _checksum(head: str) -> str:
    return _base62(zlib.crc32(head.encode("ascii")), _CHECK_LENGTH)


def generate() -> str:
    """A new key value, shown to its owner once."""
    body = "".join(secrets.choice(_BASE62) for _ in range(_BODY_LENGTH))
    head = PREFIX + body
    return head + _checksum(head)


def is_well_formed(value: str) -> bool:
    """Whether ``value`` has the key's prefix, length, alphabet and a matching checksum."""
    if len(value) != KEY_LENGTH or not value.startswith(PREFIX):
        return False
    rest = value[len(PREFIX) :]
    if not _BASE62_SET.issuperset(rest):
        return False
    head, check = value[:-_CHECK_LENGTH], value[-_CHECK_LENGTH:]
    return secrets.compare_digest(_checksum(head), check)


def digest(value: str) -> str:
    """The stored form of a key: hex SHA-256."""
    return hashlib.sha256(value.encode("ascii")).hexdigest()
