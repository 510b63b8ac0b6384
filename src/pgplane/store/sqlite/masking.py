"""Anonymized branches' masking rules and the state of their masking."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from pgplane.core.models import BranchMasking
from pgplane.store.sqlite.common import Statements

_COLUMNS = (
    "branch_id, project_id, masking_rules, state, status_message, masked_columns, created_at,"
    " updated_at, started_at, completed_at, failed_at"
)
_rules = msgspec.json.Decoder(list[dict[str, str]])


def _masking(r: Sequence[Any]) -> BranchMasking:
    return BranchMasking(
        branch_id=r[0],
        project_id=r[1],
        masking_rules=_rules.decode(r[2]),
        state=r[3],
        status_message=r[4],
        masked_columns=r[5],
        created_at=r[6],
        updated_at=r[7],
        started_at=r[8],
        completed_at=r[9],
        failed_at=r[10],
    )


class MaskingMixin(Statements):
    """The masking part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def get_masking(self, branch_id: str) -> BranchMasking | None:
        r = await self._c.one(
            f"SELECT {_COLUMNS} FROM branch_masking WHERE branch_id = ?", (branch_id,)
        )
        return _masking(r) if r else None

    async def put_masking(self, masking: BranchMasking) -> None:
        m = masking
        names = _COLUMNS.split(", ")
        updated = ", ".join(f"{c} = excluded.{c}" for c in names[2:])
        await self._c.execute(
            f"INSERT INTO branch_masking ({_COLUMNS}) VALUES ({', '.join('?' * len(names))})"
            f" ON CONFLICT (branch_id) DO UPDATE SET {updated}",
            (
                m.branch_id,
                m.project_id,
                msgspec.json.encode(m.masking_rules).decode(),
                m.state,
                m.status_message,
                m.masked_columns,
                m.created_at,
                m.updated_at,
                m.started_at,
                m.completed_at,
                m.failed_at,
            ),
        )
