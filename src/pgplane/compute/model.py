"""What the compute driver contract (:mod:`pgplane.compute.driver`) speaks in: its errors, and
the values it takes and returns. Plain data, shared by the engine and every driver."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar


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


class MaskingFailed(ComputeError):
    """An anonymized branch's masking could not be applied (a table or column it names is not
    there, Postgres refused a masked value): retrying the same rules cannot help."""

    permanent = True


class InvalidSettings(ComputeError):
    """Postgres refuses a setting's value; the message is Postgres' own words for why."""


class PortInUse(ComputeError):
    """Another program holds the port the compute was given: the platform gives it another."""

    def __init__(self, port: int) -> None:
        super().__init__(f"port {port} is in use by another program")
        self.port = port


@dataclass(frozen=True, slots=True)
class ShippingRound:
    """What one round of shipping history found: files stored, branches that failed, and what
    is still only here (the oldest WAL file not yet shipped, its age in seconds, and bytes)."""

    files: int = 0
    failed: int = 0
    lag_seconds: float = 0.0
    unshipped_bytes: int = 0
    more: bool = False  # a branch's share of the round was spent with files left: go on now


@dataclass(frozen=True, slots=True)
class RoleSpec:
    """A role as the branch must hold it: its password (SCRAM-hashed by Postgres) and LOGIN.

    ``login=False`` is Neon's ``no_login``: the role exists (it can own objects, be granted) but
    cannot connect. An empty password leaves the role without one. ``replication``: the role
    may replicate (logical replication is on in its project), as Neon's roles may there.
    """

    name: str
    password: str
    login: bool = True
    replication: bool = False


@dataclass(frozen=True, slots=True)
class ColumnMask:
    """One masking rule, checked (core/masking.py): the column, and its masking function's
    expression or a constant value."""

    database: str
    schema: str
    table: str
    column: str
    function: str | None = None
    value: str | None = None


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
    # Its project's enable_logical_replication: wal_level=logical (it cannot be turned off).
    logical_replication: bool = False


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
    directory takes on disk; ``history`` those of its history (WAL archive, base states). With
    an object store, ``archived_at`` is when its newest shipped WAL was written (epoch us) and
    ``archived_bytes`` what its history's objects take there; ``unarchived_bytes`` its archived
    WAL not shipped yet, the oldest written at ``unarchived_since`` (epoch us)."""

    logical: int | None
    data: int | None
    history: int | None
    wal_lsn: int | None = None
    archived_at: int | None = None
    archived_bytes: int | None = None
    unarchived_bytes: int | None = None
    unarchived_since: int | None = None
