"""The compute driver contract: what the engine asks of the data plane.

Every method converges ("make it so"): calling it again after a success, or after a crash half-way
through, is safe and ends in the same state. A driver for another substrate (Kubernetes pods,
remote hosts) implements this same protocol; the engine never knows which one it talks to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set
from typing import Protocol

from pgplane.compute.model import (
    BranchStorage,
    ColumnMask,
    ComputeAddress,
    ComputeError,
    ComputeSpec,
    ComputeUsage,
    ConfigChange,
    DatabaseNotFound,
    DatabaseSpec,
    HistoryBounds,
    InvalidSettings,
    MaskingFailed,
    Point,
    PointNotInHistory,
    PortInUse,
    RestoreFailed,
    RoleSpec,
    RunningCompute,
    SchemaTooLarge,
    ShippingRound,
)
from pgplane.compute.snapshots import SnapshotDriver

# The values and errors live in compute/model.py; named here too, where callers have always
# found them with the contract.
__all__ = [
    "BranchStorage",
    "ColumnMask",
    "ComputeAddress",
    "ComputeDriver",
    "ComputeError",
    "ComputeSpec",
    "ComputeUsage",
    "ConfigChange",
    "DatabaseNotFound",
    "DatabaseSpec",
    "HistoryBounds",
    "InvalidSettings",
    "MaskingFailed",
    "Point",
    "PointNotInHistory",
    "PortInUse",
    "RestoreFailed",
    "RoleSpec",
    "RunningCompute",
    "SchemaTooLarge",
    "ShippingRound",
]


class ComputeDriver(SnapshotDriver, Protocol):
    def pg_versions(self) -> Sequence[int]:
        """Postgres major versions this driver can serve, ascending."""
        ...

    async def create_timeline(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        roles: Sequence[RoleSpec],
        databases: Sequence[DatabaseSpec],
    ) -> None:
        """Create the root branch's data: a fresh cluster with these roles and databases."""
        ...

    async def create_branch(
        self,
        *,
        project_id: str,
        parent_branch_id: str,
        branch_id: str,
        pg_version: int,
        point: Point | None = None,
    ) -> int | None:
        """Create the branch's data: a consistent copy of its parent's data at its head, or at
        ``point`` of the parent's history. The LSN of the parent it starts from, when known.

        A running parent is copied online, without stopping it; a stopped one as files; a point
        is rebuilt from the parent's history, never touching the parent's data.
        """
        ...

    async def create_schema_only_branch(
        self,
        *,
        project_id: str,
        source_branch_id: str,
        branch_id: str,
        pg_version: int,
        point: Point | None,
        max_bytes: int,
        roles: Sequence[RoleSpec] = (),
        databases: Sequence[DatabaseSpec] = (),
    ) -> Mapping[str, str]:
        """Create the branch's data as a new root of its own history: a fresh cluster holding
        the source's roles (their SCRAM verifiers), databases and schema objects as they are at
        its head or at ``point``, with no rows (``pg_dump --schema-only`` of each database, at
        most ``max_bytes`` in all, restored as the tenant's roles, never as a superuser). Of
        ``roles`` and ``databases`` (the branch's in the store), those the source did not hold
        at the point are created, empty.

        The source is read as ``dump_schema`` reads it: a suspended compute is not woken. The
        verifiers of the login roles the branch holds, for the proxy. RestoreFailed names what
        could not be restored.
        """
        ...

    async def restore_branch(
        self,
        *,
        project_id: str,
        branch_id: str,
        source_branch_id: str,
        pg_version: int,
        point: Point | None,
        preserve_branch_id: str | None,
        restore_id: str,
    ) -> int | None:
        """Replace the branch's data with the source's at its head or ``point`` (the source may
        be the branch itself); the old data becomes ``preserve_branch_id``'s, or is dropped.
        Computes on the branch are stopped (their connections end); the caller starts them
        again. ``restore_id`` names this restore, so a retry after it completed changes nothing.
        The LSN of the source the data starts from, when known."""
        ...

    async def history_bounds(
        self, *, project_id: str, branch_id: str, pg_version: int
    ) -> HistoryBounds:
        """What of the branch's history can be rebuilt now (see HistoryBounds)."""
        ...

    async def keep_history(self) -> None:
        """Take the base states due and free what fell out of each project's window."""
        ...

    async def delete_timeline(self, *, project_id: str, branch_id: str) -> None:
        """Stop whatever runs on the branch's data and remove it; no-op when it is gone."""
        ...

    async def apply_config(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        compute: ComputeSpec | None,
        change: ConfigChange,
    ) -> None:
        """Converge the branch's roles and databases with ``change``, with real SQL.

        Through ``compute``, started if it is not running; a branch without a compute gets a
        temporary postmaster for the time it takes.
        """
        ...

    async def anonymize(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        compute: ComputeSpec | None,
        masks: Sequence[ColumnMask],
    ) -> int:
        """Mask every row of each column in the branch's data, with real SQL (through
        ``compute`` if it runs, else a temporary postmaster no client reaches); return how many
        columns were masked. MaskingFailed when a rule cannot apply: a database's masks apply
        whole or not at all."""
        ...

    async def start_compute(self, spec: ComputeSpec) -> None:
        """Run the endpoint's postmaster; return once it accepts a real client startup."""
        ...

    async def check_settings(self, *, pg_version: int, settings: Mapping[str, str]) -> None:
        """Raise InvalidSettings unless Postgres ``pg_version`` accepts every value (its type,
        unit, range or choices), so a bad one is refused before a compute is restarted with it."""
        ...

    def compute_address(self, *, endpoint_id: str, port: int) -> ComputeAddress:
        """Where the endpoint's compute listens once started (for the proxy)."""
        ...

    async def stop_compute(self, *, project_id: str, branch_id: str, endpoint_id: str) -> None:
        """Stop the endpoint's postmaster (fast shutdown); no-op when it is not running."""
        ...

    async def is_compute_running(
        self, *, project_id: str, branch_id: str, endpoint_id: str
    ) -> bool:
        """Whether a live postmaster serves the endpoint, read from the data directory."""
        ...

    async def compute_halted(self, *, project_id: str, branch_id: str, endpoint_id: str) -> bool:
        """Whether the endpoint's running compute has a process stopped (its tenant sent it
        SIGSTOP): it answers nothing until continued, so a stop asks it nothing first."""
        ...

    async def check_availability(
        self, *, project_id: str, branch_id: str, pg_version: int, compute: ComputeSpec | None
    ) -> None:
        """Prove the branch's data readable: every database answers a query.

        Through ``compute`` when it runs; otherwise a temporary postmaster starts on the data for
        the check (so a suspended compute is also proved able to start). ComputeError says why not.
        """
        ...

    async def dump_schema(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        db_name: str,
        max_bytes: int,
        point: Point | None = None,
    ) -> str:
        """The schema of one database of the branch, as ``pg_dump --schema-only`` prints it
        with the project's own major, without the platform's roles.

        Through whatever compute runs on the branch; a branch with none is read by a temporary
        postmaster, so a suspended compute is not woken. At ``point``: the branch's data there,
        rebuilt from its history into a temporary directory that is removed afterwards
        (PointNotInHistory when the history no longer holds it). DatabaseNotFound when the data
        has no such database, SchemaTooLarge past ``max_bytes``.
        """
        ...

    async def last_activity(self, spec: ComputeSpec) -> float | None:
        """When a client last used the running compute (epoch seconds), as Postgres sees it;
        None when it has no client or is not running; ComputeError when it runs but cannot be
        asked."""
        ...

    async def compute_usage(
        self, *, project_id: str, branch_id: str, endpoint_id: str
    ) -> Sequence[ComputeUsage]:
        """The endpoint's runs this driver has figures for, oldest first: the ones that ended
        lately (their last figures, read as they stopped) and the one running now."""
        ...

    async def branch_storage(
        self, *, project_id: str, branch_id: str, walk: bool = True
    ) -> BranchStorage:
        """What the branch takes now (blocking work done off the event loop); ``walk=False``
        asks only its running compute (its data and history left unknown)."""
        ...

    async def login_roles(
        self, spec: ComputeSpec, *, names: Sequence[str] | None = None
    ) -> Mapping[str, str] | None:
        """The SCRAM verifiers of the running compute's login roles (all, or those of ``names``)
        other than the platform's own: what the proxy needs to authenticate roles made with SQL.

        None when the compute does not run; ComputeError when it runs but cannot be asked.
        """
        ...

    async def detach_tenant(self, *, project_id: str) -> None:
        """Move the project's data to the cold archive (compressed, checksummed), then free the
        hot copy; computes are stopped first. Done when there is nothing hot left."""
        ...

    async def reattach_tenant(self, *, project_id: str) -> None:
        """Restore the project's data from the cold archive, verifying every checksum, then drop
        the archive. Done when the data is hot and there is no archive."""
        ...

    async def attach_tenant(
        self,
        *,
        project_id: str,
        branch_ids: Sequence[str],
        pg_version: int,
        history_retention_seconds: int,
    ) -> None:
        """Make the project's data hot here: from the cold archive when there is one (as
        ``reattach_tenant``), else rebuilt from the branches' history on shared storage (its
        node lost), each branch to the end of what was shipped, its storage settings recorded
        first (an archive brings its own). Done when the data is hot;
        ComputeError names the branches that could not be rebuilt, once the others are."""
        ...

    def shared_storage(self) -> str | None:
        """The id of the shared storage this driver keeps what moves on (two drivers reading
        the same id can move projects between them); None when it keeps all on its own disk."""
        ...

    async def ship_history(self, project_ids: Set[str] | None = None) -> ShippingRound | None:
        """Copy each branch's new history to shared storage (of ``project_ids`` only, when
        given), and free there what it freed here; None without shared storage."""
        ...

    async def tenant_state(self, *, project_id: str) -> str:
        """Where the project's data is on this substrate: ``hot``, ``archived``, ``both`` (a
        detach or reattach was interrupted) or ``none``."""
        ...

    async def running_computes(self) -> Sequence[RunningCompute]:
        """Every postmaster serving data of this driver now (after a crash: what was left)."""
        ...

    async def apply_storage_config(
        self, *, project_id: str, history_retention_seconds: int
    ) -> None:
        """Record the project's storage settings where the storage layer reads them."""
        ...

    async def delete_tenant(self, *, project_id: str) -> None:
        """Stop every compute of the project and remove all of its data."""
        ...

    async def close(self) -> None:
        """Release what the driver holds (not the postmasters: they outlive the platform)."""
        ...
