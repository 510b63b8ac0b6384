"""Branch annotations: one map of strings per branch, kept as JSON beside it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from pgplane.core.models import Annotation
from pgplane.store.sqlite.common import Statements

_decode = msgspec.json.Decoder(dict[str, str])


def _annotation(r: Sequence[Any]) -> Annotation:
    return Annotation(branch_id=r[0], value=_decode.decode(r[1]), created_at=r[2], updated_at=r[3])


class AnnotationsMixin(Statements):
    """The annotation part of :class:`pgplane.store.base.Tx` (both backends)."""

    async def get_annotation(self, branch_id: str) -> Annotation | None:
        r = await self._c.one(
            "SELECT branch_id, value, created_at, updated_at FROM branch_annotations"
            " WHERE branch_id = ?",
            (branch_id,),
        )
        return _annotation(r) if r else None

    async def list_annotations(self, project_id: str) -> dict[str, Annotation]:
        rows = await self._c.all(
            "SELECT a.branch_id, a.value, a.created_at, a.updated_at FROM branch_annotations a"
            " JOIN branches b ON b.id = a.branch_id"
            " WHERE b.project_id = ? AND b.deleted_at IS NULL",
            (project_id,),
        )
        return {r[0]: _annotation(r) for r in rows}

    async def set_annotation(self, *, branch_id: str, value: Mapping[str, str], now: int) -> None:
        if not value:
            await self._c.execute(
                "DELETE FROM branch_annotations WHERE branch_id = ?", (branch_id,)
            )
            return
        await self._c.execute(
            "INSERT INTO branch_annotations (branch_id, value, created_at, updated_at)"
            " VALUES (?1, ?2, ?3, ?3) ON CONFLICT (branch_id)"
            " DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
            (branch_id, msgspec.json.encode(dict(value)).decode(), now),
        )
