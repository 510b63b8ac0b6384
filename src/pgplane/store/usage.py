"""The usage side of the store contract (core/usage.py): what computes and branches used.

Part of :class:`pgplane.store.base.Tx`, whose guarantees hold here too (nothing commits on its
own). Kept per endpoint (also once it is deleted: a project's figures include its deleted
computes), per branch (its sizes) and per branch and hour (the consumption history).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

from pgplane.core.usage import BranchSizes, EndpointUsage, HourUsage, StorageTotals, Totals


class UsageTx(abc.ABC):
    """Usage figures, as the usage sampler writes them and the API reads them."""

    @abc.abstractmethod
    async def get_endpoint_usage(self, endpoint_id: str) -> EndpointUsage | None: ...

    @abc.abstractmethod
    async def list_endpoint_usage(self, project_id: str) -> dict[str, EndpointUsage]: ...

    @abc.abstractmethod
    async def put_endpoint_usage(self, usage: EndpointUsage, hours: Sequence[HourUsage]) -> None:
        """Keep ``usage`` and add ``hours`` to the hourly records."""

    @abc.abstractmethod
    async def branch_usage(self, project_id: str) -> dict[str, Totals]:
        """The project's endpoints' usage summed per branch, deleted endpoints' included."""

    @abc.abstractmethod
    async def project_usage(self, project_ids: Sequence[str]) -> dict[str, Totals]: ...

    @abc.abstractmethod
    async def get_branch_sizes(self, branch_id: str) -> BranchSizes | None: ...

    @abc.abstractmethod
    async def put_branch_sizes(self, sizes: BranchSizes, hours: Sequence[HourUsage]) -> None:
        """Keep ``sizes`` and add ``hours`` (storage over time) to the hourly records."""

    @abc.abstractmethod
    async def list_branch_sizes(self, project_id: str) -> dict[str, BranchSizes]:
        """The sizes of the project's branches that are not deleted, by branch id."""

    @abc.abstractmethod
    async def project_storage(self, project_ids: Sequence[str]) -> dict[str, StorageTotals]:
        """Each project's live branches' sizes summed (absent: none sampled yet)."""

    @abc.abstractmethod
    async def storage_targets(self) -> list[tuple[str, str]]:
        """(project id, branch id) of every ready branch of an attached, live project."""

    @abc.abstractmethod
    async def prune_usage_hours(self, *, before_hour: int) -> int: ...

    @abc.abstractmethod
    async def usage_hours(
        self, project_id: str, *, from_hour: int, to_hour: int
    ) -> list[tuple[HourUsage, bool]]:
        """The project's hourly records in ``[from_hour, to_hour)`` (epoch seconds), by hour,
        each with whether its branch is a root branch (a deleted one counts as a child)."""
