"""What the statements of every aggregate share: JSON columns, unique-index conflicts."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

import msgspec

from pgplane.errors import AlreadyExists, Conflict

_json_encode = msgspec.json.encode
_json_decode = msgspec.json.decode


def _unique_violation(exc: sqlite3.IntegrityError) -> bool:
    """A unique index or primary key broken (not a foreign key or NOT NULL: those are bugs)."""
    return exc.sqlite_errorcode in (
        sqlite3.SQLITE_CONSTRAINT_UNIQUE,
        sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY,
    )


def _taken(kind: str, name: str) -> AlreadyExists:
    """Neon's message, the name quoted as Go's %q does: ``role already exists; role_name:"x"``."""
    quoted = json.dumps(name, ensure_ascii=False)
    return AlreadyExists(kind, f"{kind} already exists; {kind}_name:{quoted}")


class Statements:
    """The connection every mixin of :class:`~pgplane.store.sqlite.tx.SqliteTx` runs on."""

    _c: sqlite3.Connection

    def _write(self, sql: str, params: Sequence[Any], conflict: Conflict) -> sqlite3.Cursor:
        """Execute an INSERT or UPDATE; a unique index it breaks raises ``conflict``.

        The indexes are the guarantee (two requests racing for one name both pass any check made
        before): whatever the services checked, a duplicate ends here as a 409, never a 500.
        """
        try:
            return self._c.execute(sql, params)
        except sqlite3.IntegrityError as exc:
            if _unique_violation(exc):
                raise conflict from exc
            raise
