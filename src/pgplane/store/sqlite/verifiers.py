"""Synced SCRAM verifiers of roles made with SQL (the ``role_verifiers`` table)."""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping


class RoleVerifiersMixin:
    """The role-verifier part of :class:`pgplane.store.base.Tx` for SQLite."""

    _c: sqlite3.Connection

    async def get_role_verifier(self, *, branch_id: str, name: str) -> str | None:
        row = self._c.execute(
            "SELECT verifier FROM role_verifiers WHERE branch_id = ? AND name = ?",
            (branch_id, name),
        ).fetchone()
        return None if row is None else str(row[0])

    async def set_role_verifiers(self, *, branch_id: str, verifiers: Mapping[str, str]) -> None:
        self._c.execute("DELETE FROM role_verifiers WHERE branch_id = ?", (branch_id,))
        self._c.executemany(
            "INSERT INTO role_verifiers (branch_id, name, verifier) VALUES (?, ?, ?)",
            [(branch_id, name, verifier) for name, verifier in sorted(verifiers.items())],
        )

    async def copy_role_verifiers(self, *, from_branch_id: str, to_branch_id: str) -> None:
        self._c.execute(
            "INSERT OR REPLACE INTO role_verifiers (branch_id, name, verifier)"
            " SELECT ?, name, verifier FROM role_verifiers WHERE branch_id = ?",
            (to_branch_id, from_branch_id),
        )
