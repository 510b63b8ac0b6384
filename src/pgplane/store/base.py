"""The store contract.

Every backend (SQLite embedded, PostgreSQL for a control plane of several processes) implements
:class:`Store` and :class:`Tx` with exactly these guarantees, so services never know which one
they talk to.

Atomicity:

- Everything done through one ``Tx`` from :meth:`Store.write` commits together or not at all.
  Services never commit: the caller that opened the transaction owns it, so "project + branch +
  endpoint + roles + operations" is one atomic change.
- Write transactions are serializable: one sees every write committed before it began, and
  none commits a decision made on counts another changed meanwhile. Quotas rely on it
  (services/quotas.py counts, then writes); both backends run one writer at a time (SQLite's
  lock; on PostgreSQL an advisory lock every process's writers take), the engine's claims
  aside, whose compare-and-set needs none.
- ``Tx`` from :meth:`Store.read` sees committed data only; each call is atomic on its own, but
  two calls may see different snapshots. Read-modify-write belongs in :meth:`Store.write`.
- Unique names are enforced by the store, not by a read-then-insert in a service: inserting a
  duplicate raises :class:`pgplane.errors.Conflict` and leaves the transaction usable only for
  rollback.
- Claiming an operation (:meth:`Tx.claim_operation`) and every later change the engine makes to
  it (:meth:`Tx.update_owned_operation`) are compare-and-set: they take effect only if the row is
  still in the state the caller saw (and, for updates, still leased by the caller), so two
  workers, in one process or many, never run the same attempt.
- Operation ``created_at`` values are unique and strictly increasing within a project: the store
  moves a new operation's timestamp forward by a microsecond where it would collide, so a cursor
  that is a timestamp pages exactly.
- Revoking a key is visible to every reader, in every process, as soon as the transaction
  commits; no backend may cache key lookups across transactions.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager

from pgplane.core.models import (
    Annotation,
    Branch,
    BranchMasking,
    Database,
    Endpoint,
    Project,
    Role,
)
from pgplane.store.accounts import AccountsTx
from pgplane.store.nodes import NodesTx
from pgplane.store.operations import OperationsTx
from pgplane.store.snapshots import SnapshotsTx
from pgplane.store.usage import UsageTx


class Tx(AccountsTx, OperationsTx, UsageTx, SnapshotsTx, NodesTx):
    """One unit of work against the store. Methods never commit.

    Its parts, each a module: the account side (accounts, API keys, the console's sign-in) is
    :class:`AccountsTx`, the engine's operations and their leases :class:`OperationsTx`, what
    computes and branches used :class:`UsageTx`, snapshots and backup schedules
    :class:`SnapshotsTx`, nodes and where projects are placed :class:`NodesTx`; projects,
    branches, endpoints, roles and databases are here.
    """

    # -- projects -------------------------------------------------------------------------------

    @abc.abstractmethod
    async def insert_project(self, project: Project) -> None: ...

    @abc.abstractmethod
    async def get_project(
        self, *, account_id: str, project_id: str, include_deleted: bool = False
    ) -> Project | None:
        """The project if it belongs to the account; ``locked`` is derived from its operations."""

    @abc.abstractmethod
    async def get_project_by_id(self, project_id: str) -> Project | None:
        """Any project, deleted or not, for platform work (the engine)."""

    @abc.abstractmethod
    async def list_projects(
        self, *, account_id: str, after_id: str | None, limit: int, search: str | None = None
    ) -> list[Project]:
        """The account's live projects, newest first, starting after the project ``after_id``;
        with ``search``, those whose name (in any case) or id holds it."""

    @abc.abstractmethod
    async def count_projects(self, account_id: str) -> int:
        """How many live projects the account has (its quota counts them)."""

    @abc.abstractmethod
    async def project_exists(self, *, account_id: str, project_id: str) -> bool:
        """Whether the id names a project of the account, deleted or not (cursor validation)."""

    @abc.abstractmethod
    async def update_project(self, project: Project) -> None:
        """Write the mutable fields: name, settings, retention, updated_at, deleted_at."""

    # -- branches, endpoints, roles, databases --------------------------------------------------

    @abc.abstractmethod
    async def set_project_storage(self, *, project_id: str, state: str) -> None:
        """Record where the project's data is: ``attached`` or ``detached``."""

    @abc.abstractmethod
    async def detach_candidates(self, *, idle_before: int) -> list[str]:
        """Attached live projects with no activity and no user operation since ``idle_before``."""

    @abc.abstractmethod
    async def insert_branch(self, branch: Branch) -> None:
        """Insert; a live branch of the same name in the project raises Conflict."""

    @abc.abstractmethod
    async def get_branch(self, *, project_id: str, branch_id: str) -> Branch | None: ...

    @abc.abstractmethod
    async def list_branches(self, project_id: str) -> list[Branch]:
        """The project's live branches, newest first."""

    @abc.abstractmethod
    async def update_branch(self, branch: Branch) -> None:
        """Write every field but the ids and created_at; a taken name raises Conflict."""

    @abc.abstractmethod
    async def delete_branch(self, *, branch_id: str, now: int) -> None:
        """Mark the branch deleted (its name is free again at once)."""

    @abc.abstractmethod
    async def count_branches(self, project_id: str) -> int:
        """How many live branches the project has (its quota counts them)."""

    @abc.abstractmethod
    async def has_child_branches(self, branch_id: str) -> bool:
        """Whether a live branch was created from this one."""

    @abc.abstractmethod
    async def expired_branches(self, *, now: int) -> list[Branch]:
        """Live branches of live projects whose ``expires_at`` is ``now`` or earlier, soonest
        first."""

    @abc.abstractmethod
    async def get_annotation(self, branch_id: str) -> Annotation | None: ...

    @abc.abstractmethod
    async def list_annotations(self, project_id: str) -> dict[str, Annotation]:
        """The annotations of the project's live branches, by branch id."""

    @abc.abstractmethod
    async def set_annotation(self, *, branch_id: str, value: Mapping[str, str], now: int) -> None:
        """Replace the branch's annotation (created if new); an empty map removes it."""

    @abc.abstractmethod
    async def get_masking(self, branch_id: str) -> BranchMasking | None:
        """An anonymized branch's masking rules and state; None for any other branch."""

    @abc.abstractmethod
    async def put_masking(self, masking: BranchMasking) -> None:
        """Write the branch's masking rules and state (created if new)."""

    @abc.abstractmethod
    async def set_branch_state(
        self, *, branch_id: str, current_state: str, pending_state: str | None, now: int
    ) -> None: ...

    @abc.abstractmethod
    async def insert_endpoint(self, endpoint: Endpoint) -> None:
        """Insert; a second live read_write endpoint of a branch, or a taken port: Conflict."""

    @abc.abstractmethod
    async def get_endpoint(self, *, project_id: str, endpoint_id: str) -> Endpoint | None: ...

    @abc.abstractmethod
    async def find_endpoint(self, endpoint_id: str) -> Endpoint | None:
        """A live endpoint by id alone (the proxy knows no project)."""

    @abc.abstractmethod
    async def list_live_endpoints(self) -> list[Endpoint]:
        """Every live endpoint of every live project (for the scheduler)."""

    @abc.abstractmethod
    async def list_running_endpoints(self, account_id: str) -> list[Endpoint]:
        """The account's computes that run or are due to, for its quotas: live, enabled endpoints
        of its live projects that are ``active`` with nothing pending, pending ``active``, or
        have a ``start_compute`` not yet settled (a start queued behind a suspend).

        Read in the transaction that starts another, so two concurrent starts see each other.
        """

    @abc.abstractmethod
    async def record_endpoint_activity(self, activity: Sequence[tuple[str, int]]) -> None:
        """Move each endpoint's ``last_active`` forward to the given time (never back)."""

    @abc.abstractmethod
    async def list_endpoints(self, project_id: str) -> list[Endpoint]:
        """The project's live endpoints, newest first."""

    @abc.abstractmethod
    async def update_endpoint(self, endpoint: Endpoint) -> None:
        """Write the mutable fields: limits, suspend timeout, settings, disabled, states."""

    @abc.abstractmethod
    async def set_endpoint_branch(self, *, endpoint_id: str, branch_id: str, now: int) -> None:
        """Bind the endpoint to another branch of its project (a finalized restore moves the
        replaced branch's computes); a second live read_write endpoint there: Conflict."""

    @abc.abstractmethod
    async def set_endpoint_port(self, *, endpoint_id: str, port: int, now: int) -> None:
        """Move the endpoint's compute to ``port`` (its old one was taken by another program)."""

    @abc.abstractmethod
    async def delete_endpoint(self, *, endpoint_id: str, now: int) -> None:
        """Mark the endpoint deleted."""

    @abc.abstractmethod
    async def used_ports(self, *, held_since: int) -> set[int]:
        """Ports held by live endpoints, or by endpoints deleted after ``held_since``.

        A deleted endpoint's postmaster stops only when its operation runs: its port is not
        handed out again at once.
        """

    @abc.abstractmethod
    async def set_endpoint_state(
        self,
        *,
        endpoint_id: str,
        current_state: str,
        pending_state: str | None,
        now: int,
    ) -> None:
        """Record an observed compute state (``active`` sets started_at, ``idle`` suspended_at)."""

    @abc.abstractmethod
    async def delete_project_endpoints(self, *, project_id: str, now: int) -> None:
        """Mark every endpoint of the project deleted, releasing their ports."""

    @abc.abstractmethod
    async def insert_role(self, role: Role) -> None:
        """Insert; a live role of the same name on the branch raises Conflict."""

    @abc.abstractmethod
    async def get_role(self, *, branch_id: str, name: str) -> Role | None:
        """The live role of that name."""

    @abc.abstractmethod
    async def list_roles(self, branch_id: str, *, deleted: bool = False) -> list[Role]:
        """The branch's live roles, oldest first; with ``deleted``, the tombstones instead."""

    @abc.abstractmethod
    async def update_role(self, role: Role) -> None:
        """Write password, login and updated_at of the live role."""

    @abc.abstractmethod
    async def delete_role(self, *, branch_id: str, name: str, now: int) -> None:
        """Turn the live role into a tombstone until its drop is applied."""

    @abc.abstractmethod
    async def purge_roles(self, *, branch_id: str, tombstones: Sequence[Role]) -> None:
        """Forget these tombstones (their drop was applied)."""

    # What the proxy knows of roles made with SQL on a compute: their SCRAM verifiers (name →
    # ``SCRAM-SHA-256$…``), synced from the compute, so it can authenticate them before waking it.
    @abc.abstractmethod
    async def get_role_verifier(self, *, branch_id: str, name: str) -> str | None:
        """The verifier last synced for a login role of the branch's compute, if any."""

    @abc.abstractmethod
    async def set_role_verifiers(self, *, branch_id: str, verifiers: Mapping[str, str]) -> None:
        """Replace everything synced for the branch with ``verifiers``."""

    @abc.abstractmethod
    async def copy_role_verifiers(self, *, from_branch_id: str, to_branch_id: str) -> None:
        """A new branch starts with its parent's roles, so with its parent's verifiers."""

    @abc.abstractmethod
    async def insert_database(
        self,
        *,
        branch_id: str,
        name: str,
        owner_name: str,
        now: int,
        applied_name: str | None = None,
    ) -> Database:
        """Insert (the store assigns the integer id); a live duplicate name raises Conflict.

        ``applied_name``: the name the database already has on the branch's data, if it has one.
        """

    @abc.abstractmethod
    async def get_database(self, *, branch_id: str, name: str) -> Database | None:
        """The live database of that name."""

    @abc.abstractmethod
    async def list_databases(self, branch_id: str, *, deleted: bool = False) -> list[Database]:
        """The branch's live databases by id; with ``deleted``, the tombstones instead."""

    @abc.abstractmethod
    async def update_database(self, database: Database) -> None:
        """Write name, owner and updated_at; a taken name raises Conflict."""

    @abc.abstractmethod
    async def delete_database(self, *, database_id: int, now: int) -> None:
        """Turn the live database into a tombstone until its drop is applied."""

    @abc.abstractmethod
    async def mark_databases_applied(self, applied: Sequence[tuple[int, str]]) -> None:
        """Record ``(database_id, name)``: the name each has on the compute now."""

    @abc.abstractmethod
    async def purge_databases(self, database_ids: Sequence[int]) -> None:
        """Forget these tombstones (their drop was applied)."""


class Store(abc.ABC):
    """A connection to the platform's metadata."""

    @abc.abstractmethod
    def read(self) -> AbstractAsyncContextManager[Tx]:
        """A reader: sees committed data, changes nothing."""

    @abc.abstractmethod
    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A transaction: commits on normal exit, rolls back if the block raises."""

    @abc.abstractmethod
    async def probe(self) -> None:
        """Raise Unavailable unless the store serves a read and commits a write now.

        For readiness checks. The write reaches the disk the way real writes do (a full disk or an
        I/O error fails it) and changes nothing a client can see.
        """

    async def watch_operations(self, wake: Callable[[], None]) -> None:  # noqa: B027 - optional
        """Call ``wake`` when another process commits new or settled operations, until cancelled.

        A store shared by several processes announces them (PostgreSQL: LISTEN/NOTIFY); the
        engine's polling is the fallback, and all there is for SQLite, whose writers are this
        process (which wakes its engine itself) or the CLI's rare ones.
        """

    @abc.abstractmethod
    async def close(self) -> None: ...
