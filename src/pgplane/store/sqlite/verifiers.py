"""Synced SCRAM verifiers of roles made with SQL (the ``role_verifiers`` table)."""

from __future__ import annotations

from collections.abc import Mapping

from pgplane.store.sqlite.common import Statements


class RoleVerifiersMixin(Statements):
    """The role-verifier part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def get_role_verifier(self, *, branch_id: str, name: str) -> str | None:
        row = await self._c.one(
            "SELECT verifier FROM role_verifiers WHERE branch_id = ? AND name = ?",
            (branch_id, name),
        )
        return None if row is None else str(row[0])

    async def set_role_verifiers(self, *, branch_id: str, verifiers: Mapping[str, str]) -> None:
        await self._c.execute("DELETE FROM role_verifiers WHERE branch_id = ?", (branch_id,))
        await self._c.executemany(
            "INSERT INTO role_verifiers (branch_id, name, verifier) VALUES (?, ?, ?)",
            [(branch_id, name, verifier) for name, verifier in sorted(verifiers.items())],
        )

    async def copy_role_verifiers(self, *, from_branch_id: str, to_branch_id: str) -> None:
        await self._c.execute(
            "INSERT INTO role_verifiers (branch_id, name, verifier)"
            " SELECT ?, name, verifier FROM role_verifiers WHERE branch_id = ?"
            " ON CONFLICT (branch_id, name) DO UPDATE SET verifier = excluded.verifier",
            (to_branch_id, from_branch_id),
        )
