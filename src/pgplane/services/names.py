"""Names users give objects: checked here once, so no layer below sees one it cannot hold."""

from __future__ import annotations

import re

from pgplane.errors import BadRequest

MAX_OBJECT_NAME = 256
MAX_ENDPOINT_NAME = 64  # Neon's limit for a compute's name
MAX_API_KEY_NAME = 64
MAX_PG_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: Postgres would silently truncate longer names

# Names Postgres or the platform keep for themselves (role names compare in any case): the
# platform's superuser and its read-only monitor exist on every compute
# (compute/local/postgres/sessions.py).
_RESERVED_ROLES = frozenset(
    {
        "cloud_admin",
        "pgplane_monitor",
        "public",
        "none",
        "current_user",
        "session_user",
        "current_role",
    }
)
_RESERVED_ROLE_PREFIX = "pg_"
_RESERVED_DATABASES = frozenset({"postgres", "template0", "template1"})

# The rules below as regular expressions (ECMA-262, as OpenAPI wants, and Python alike), for the
# API document. Spaces are spelled out: Python's str.isspace() and ECMA's \s disagree at the edges.
_CONTROL = r"\x00-\x1f\x7f"
_SPACE = r"\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# Not empty, not blank, no control characters.
NAME_PATTERN = rf"^[^{_CONTROL}]*[^{_CONTROL}{_SPACE}][^{_CONTROL}]*$"
# The same, without a slash (roles and databases are named in paths).
IDENTIFIER_PATTERN = rf"^[^{_CONTROL}/]*[^{_CONTROL}{_SPACE}/][^{_CONTROL}/]*$"


def any_case(word: str) -> str:
    """A regular expression matching ``word`` in any case (ECMA has no inline ``(?i)``)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


RESERVED_ROLE_PATTERN = (
    rf"^({_RESERVED_ROLE_PREFIX}[\s\S]*|"
    + "|".join(any_case(n) for n in sorted(_RESERVED_ROLES))
    + ")$"
)
RESERVED_DATABASE_PATTERN = "^(" + "|".join(sorted(_RESERVED_DATABASES)) + ")$"


def _text(kind: str, value: str, max_chars: int) -> str:
    if not value or not value.strip():
        raise BadRequest(f"{kind} name must not be empty")
    if len(value) > max_chars:
        raise BadRequest(f"{kind} name must be at most {max_chars} characters")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadRequest(f"{kind} name must not contain control characters")
    return value


def _identifier(kind: str, value: str) -> str:
    _text(kind, value, MAX_PG_IDENTIFIER_BYTES)
    if len(value.encode("utf-8")) > MAX_PG_IDENTIFIER_BYTES:
        raise BadRequest(f"{kind} name must be at most {MAX_PG_IDENTIFIER_BYTES} bytes")
    if "/" in value:
        # Paths name roles and databases, and a slash in one would be a path separator: such a
        # role could be created but never read, changed or deleted.
        raise BadRequest(f"{kind} name must not contain '/'")
    return value


def api_key(value: str) -> str:
    return _text("API key", value, MAX_API_KEY_NAME)


def project(value: str) -> str:
    return _text("project", value, MAX_OBJECT_NAME)


def endpoint(value: str) -> str:
    return _text("endpoint", value, MAX_ENDPOINT_NAME)


def branch(value: str) -> str:
    return _text("branch", value, MAX_OBJECT_NAME)


def snapshot(value: str) -> str:
    return _text("snapshot", value, MAX_OBJECT_NAME)


def role(value: str) -> str:
    name = _identifier("role", value)
    if is_reserved_role(name):
        raise BadRequest(f"role name {name!r} is reserved")
    return name


def is_reserved_role(name: str) -> bool:
    """A role of Postgres or the platform: never created through the API, never logged in as
    through the proxy."""
    return name.lower() in _RESERVED_ROLES or name.startswith(_RESERVED_ROLE_PREFIX)


def database(value: str) -> str:
    name = _identifier("database", value)
    if name in _RESERVED_DATABASES:
        raise BadRequest(f"database name {name!r} is reserved")
    return name
