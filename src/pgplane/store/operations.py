"""The operations side of the store contract: the queue of work and the engine's leases on it.

Part of :class:`pgplane.store.base.Tx`, whose guarantees hold here too (nothing commits on its
own). Two are this part's own: claiming an operation and every later change the engine makes
to it are compare-and-set, so two workers never run the same attempt; and ``created_at`` is
unique and strictly increasing within a project, so a timestamp cursor pages exactly.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from pgplane.core.models import Operation
from pgplane.core.operations import Action


class OperationsTx(abc.ABC):
    """Operations: their pages for clients, and the claims and updates of the engine."""

    @abc.abstractmethod
    async def insert_operations(self, operations: Sequence[Operation]) -> list[Operation]:
        """Insert in order; returns them as stored (``created_at`` made unique per project)."""

    @abc.abstractmethod
    async def get_operation(self, *, project_id: str, operation_id: str) -> Operation | None: ...

    @abc.abstractmethod
    async def list_operations(
        self, *, project_id: str, before: int | None, limit: int, account_id: str | None = None
    ) -> list[Operation]:
        """Newest first, only those created strictly before ``before``; keyset, never OFFSET.

        With ``account_id``, only if the project (deleted or not) belongs to that account. For
        clients' pages: the lease fields may be left ``None`` (the engine reads operations through
        the methods that claim them).
        """

    @abc.abstractmethod
    async def list_unsettled_operations(
        self, project_id: str | None = None, *, node: str | None = None
    ) -> list[Operation]:
        """Operations in ``scheduling`` or ``running`` (of one project, or all; with ``node``,
        only of the projects placed on that node), oldest first."""

    @abc.abstractmethod
    async def claim_operation(
        self,
        *,
        seen: Operation,
        owner: str,
        now: int,
        lease_until: int,
        failed_attempt: bool,
        node: str | None = None,
    ) -> Operation | None:
        """Compare-and-set ``seen`` (unchanged since read) to ``running`` leased by ``owner``;
        with ``node``, only while the operation's project is placed on that node.

        ``failed_attempt`` counts the previous, abandoned attempt (an expired lease) as a failure.
        Returns the claimed operation, or None if another worker got there first.
        """

    @abc.abstractmethod
    async def expire_leases(self, *, owners: Sequence[str], now: int) -> int:
        """End the leases these (dead) owners hold, so their operations are claimed again now."""

    @abc.abstractmethod
    async def update_owned_operation(self, operation: Operation, *, owner: str) -> bool:
        """Write the operation's state if ``owner`` still holds its lease; False otherwise."""

    @abc.abstractmethod
    async def abandon_operation(self, *, operation_id: str, error: str, now: int) -> bool:
        """Fail an unsettled operation whoever holds it (its node is lost for good: an
        operator brought its project back elsewhere); False when it had settled already. A
        lease its dead owner held is ended with it, so no late write of that owner lands."""

    @abc.abstractmethod
    async def last_operation_times(self, action: Action) -> dict[str, int]:
        """For each branch, when its latest operation of ``action`` was created."""
