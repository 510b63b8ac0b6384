"""The snapshot side of the store contract: snapshots, backup schedules and backup checks.

Part of :class:`pgplane.store.base.Tx`, whose guarantees hold here too: nothing commits on its
own. A scheduled snapshot's slot is unique per branch, and a slug among a project's live
snapshots: inserting a second one raises :class:`pgplane.errors.Conflict`, so neither is ever
taken twice, by any process.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from pgplane.core.models import BackupCheck, Snapshot


class SnapshotsTx(abc.ABC):
    """A project's snapshots and its branches' backup schedules."""

    @abc.abstractmethod
    async def insert_snapshot(self, snapshot: Snapshot) -> None:
        """Insert; a second snapshot for the same branch and schedule slot, or a slug a live
        snapshot of the project holds, raises Conflict."""

    @abc.abstractmethod
    async def get_snapshot(self, *, project_id: str, snapshot_id: str) -> Snapshot | None:
        """A snapshot of the project that is not deleted."""

    @abc.abstractmethod
    async def get_snapshot_any(self, snapshot_id: str) -> Snapshot | None:
        """Any snapshot, deleted or not, for platform work (the engine)."""

    @abc.abstractmethod
    async def list_snapshots(
        self, project_id: str, *, include_deleted: bool = False
    ) -> list[Snapshot]:
        """The project's snapshots that are not deleted (all, with ``include_deleted``: what
        the consumption history counts), oldest first."""

    @abc.abstractmethod
    async def update_snapshot(self, snapshot: Snapshot) -> None:
        """Write every field of the snapshot (by id)."""

    @abc.abstractmethod
    async def expired_snapshots(self, *, now: int, limit: int) -> list[Snapshot]:
        """Snapshots not deleted whose ``expires_at`` is at or before ``now``, oldest first."""

    @abc.abstractmethod
    async def snapshot_slug_taken(self, *, project_id: str, slug: str) -> bool:
        """Whether a live snapshot of the project holds the slug."""

    @abc.abstractmethod
    async def snapshot_slot_taken(self, *, branch_id: str, slot: str) -> bool:
        """Whether a snapshot (deleted or not) was taken for the branch's schedule slot."""

    @abc.abstractmethod
    async def get_backup_schedule(self, branch_id: str) -> tuple[list[dict[str, Any]], int] | None:
        """The branch's schedule entries and when they were set; None when it has none."""

    @abc.abstractmethod
    async def set_backup_schedule(
        self,
        *,
        project_id: str,
        branch_id: str,
        schedule: Sequence[Mapping[str, Any]],
        now: int,
    ) -> None:
        """Replace the branch's schedule; an empty one removes it."""

    @abc.abstractmethod
    async def list_backup_schedules(self) -> list[tuple[str, str, list[dict[str, Any]], int]]:
        """(project id, branch id, entries, set at) of every live branch that has a schedule."""

    @abc.abstractmethod
    async def put_backup_check(self, check: BackupCheck) -> None:
        """Record the branch's newest check, replacing the one before."""

    @abc.abstractmethod
    async def backup_checks(self, project_id: str | None = None) -> list[BackupCheck]:
        """The checks of live branches (of the project, when given)."""
