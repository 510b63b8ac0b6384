"""The snapshot part of the compute driver contract (:class:`..driver.ComputeDriver`): a
branch's data kept as a snapshot's own copy, freed, and restored from. Every method converges,
as the rest of the contract does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from pgplane.compute.model import Point


@dataclass(frozen=True, slots=True)
class SnapshotMade:
    """A snapshot's data, built: the LSN it shows (when known) and the bytes it takes (None:
    not counted now)."""

    lsn: int | None
    bytes: int | None


class SnapshotDriver(Protocol):
    async def create_snapshot(
        self,
        *,
        project_id: str,
        branch_id: str,
        snapshot_id: str,
        pg_version: int,
        point: Point | None,
    ) -> SnapshotMade:
        """Keep the branch's data at its head or ``point`` as the snapshot's own copy, which
        outlives the branch's history window (and the branch). Once built, a retry only reads."""
        ...

    async def delete_snapshot(self, *, project_id: str, snapshot_id: str) -> None:
        """Free the snapshot's data; no-op when it is gone."""
        ...

    async def branch_from_snapshot(
        self, *, project_id: str, snapshot_id: str, branch_id: str, pg_version: int
    ) -> None:
        """Create a new branch's data as a copy of the snapshot's."""
        ...

    async def restore_snapshot(
        self,
        *,
        project_id: str,
        snapshot_id: str,
        branch_id: str,
        pg_version: int,
        preserve_branch_id: str | None,
        restore_id: str,
    ) -> None:
        """Replace the branch's data with the snapshot's, as :meth:`restore_branch` does with a
        branch's (computes stopped, the old data to ``preserve_branch_id`` or dropped)."""
        ...
