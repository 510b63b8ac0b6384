"""The compute driver contract: what the engine asks of the data plane.

Every method converges ("make it so"): calling it again after a success, or after a crash half-way
through, is safe and ends in the same state. A driver for another substrate (Kubernetes pods,
remote hosts) implements this same protocol; the engine never knows which one it talks to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol

from pgplane.compute.snapshots import SnapshotDriver


class ComputeError(Exception):
    """The data plane could not do what was asked; the message says why, for the operation."""

    # Retrying cannot help: the engine fails the operation at once.
    permanent: ClassVar[bool] = False


class PointNotInHistory(ComputeError):
    """The point asked of a branch's history is not in it (past its end, or freed)."""

    permanent = True


class DatabaseNotFound(ComputeError):
    """The database asked for is not in the branch's data (dropped with SQL, say)."""

    permanent = True


class SchemaTooLarge(ComputeError):
    """A schema's SQL text is past the bound the caller gave."""

    permanent = True


class RestoreFailed(ComputeError):
    """What a schema-only branch holds could not be rebuilt (Postgres' own words say what):
    retrying the same schema cannot help."""

    permanent = True


class InvalidSettings(ComputeError):
    """Postgres refuses a setting's value; the message is Postgres' own words for why."""


class PortInUse(ComputeError):
    """Another program holds the port the compute was given: the platform gives it another."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is in use by another program")
        self.port = port


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """A role as the branch must hold it: its password (SCRAM-hashed by Postgres) and LOGIN.

    ``login=False`` is Neon's ``no_login``: the role exists (it can own objects, be granted) but
    cannot connect. An empty password leaves the role without one.
    """

    name: str
    password: str
    login: bool = True


@dataclass(frozen=True, slots=True)
class DatabaseSpec:
    name: str
    owner_name: str


@dataclass(frozen=True, slots=True)
class ComputeSpec:
    """Everything needed to run one endpoint's postmaster on its branch's data."""

    project_id: str
    branch_id: str
    endpoint_id: str
    pg_version: int
    port: int
    pg_settings: Mapping[str, str] = field(default_factory=dict)
    # Compute units (1 CU ~ 1 vCPU and 4 GB of RAM). A driver without autoscaling sizes the
    # compute for the maximum; pg_settings override what it derives from it.
    autoscaling_limit_min_cu: float = 0.25
    autoscaling_limit_max_cu: float = 0.25
    # A read-only compute: a hot standby of the branch's data that follows the branch's
    # read-write compute (its port: ``primary_port``, None when the branch has none) while it
    # runs, and the branch's archived WAL otherwise.
    read_only: bool = False
    primary_port: int | None = None


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """Roles and databases to converge a branch to; what is not named is left as it is.

    Applied in this order: renames (when the old name exists and the new one does not), roles
    (created or updated: password, LOGIN), databases (created, or given to their owner), dropped
    databases, dropped roles (what they own is first given to each database's owner).
    """

    roles: Sequence[RoleSpec] = ()
    databases: Sequence[DatabaseSpec] = ()
    renamed_databases: Mapping[str, str] = field(default_factory=dict)
    dropped_databases: Sequence[str] = ()
    dropped_roles: Sequence[str] = ()


@dataclass(frozen=True, slots=True)
class ComputeAddress:
    """Where a running compute accepts clients: TCP, and a unix socket when there is one."""

    host: str
    port: int
    unix_socket: str | None = None


@dataclass(frozen=True, slots=True)
class Point:
    """A moment of a branch's history: an LSN, or a time (epoch microseconds)."""

    lsn: int | None = None
    time_us: int | None = None


@dataclass(frozen=True, slots=True)
class HistoryBounds:
    """What of a branch's history can be rebuilt now: from its first base state (its LSN and
    time) to its head (None: unknown, such as while the project is detached)."""

    start_lsn: int | None = None
    start_time_us: int | None = None
    head_lsn: int | None = None


@dataclass(frozen=True, slots=True)
class RunningCompute:
    """A postmaster found running on a branch's data (by :meth:`ComputeDriver.running_computes`).

    ``endpoint_id`` is None for a temporary one (roles applied or a check run on a branch with
    no compute running).
    """

    project_id: str
    branch_id: str
    endpoint_id: str | None


@dataclass(frozen=True, slots=True)
class ComputeUsage:
    """What one run of a compute (a postmaster, from its start to its stop) used so far.

    ``run`` names the run (a restarted compute is another run); ``started_us`` is when it
    started (epoch microseconds; None where the machine does not say); ``cpu_seconds`` the CPU
    time it used since, by the kernel's accounting (``measured``: ``cgroup``, or ``processes``:
    the postmaster's and its children's own figures without cgroups); ``cpus`` the CPUs its
    quota allowed when read (None: no quota); ``ended_us`` when it stopped, None while it runs.
    """

    run: str
    started_us: int | None
    cpu_seconds: float
    measured: str
    cpus: float | None = None
    ended_us: int | None = None


@dataclass(frozen=True, slots=True)
class BranchStorage:
    """What a branch takes (bytes; None: not known now). ``logical`` is its databases' size as
    Postgres reports it, known only while a compute of the branch runs, as is ``wal_lsn``, where
    its WAL stands (how much it has written, as a byte position); ``data`` the blocks its data
    directory takes on disk; ``history`` those of its history (WAL archive, base states)."""

    logical: int | None
    data: int | None
    history: int | None
    wal_lsn: int | None = None


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
