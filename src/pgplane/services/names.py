"""Names users give objects: checked here once, so no layer below sees one it cannot hold."""

from __future__ import annotations

from pgplane.errors import BadRequest

MAX_OBJECT_NAME = 256
MAX_API_KEY_NAME = 64
MAX_PG_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: Postgres would silently truncate longer names


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


def branch(value: str) -> str:
    return _text("branch", value, MAX_OBJECT_NAME)


def role(value: str) -> str:
    return _identifier("role", value)


def database(value: str) -> str:
    return _identifier("database", value)
