"""Domain records as the store keeps them.

These are internal: they may hold secrets (a key's digest, a role's password) and are never
serialised to clients directly; the API maps them to its own response models.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pgplane.core.operations import Action, Status


class Account(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    email: str
    name: str
    created_at: int


class ConsoleSession(msgspec.Struct, frozen=True, kw_only=True):
    """A signed-in browser: the cookie's digest (never the cookie), and its forms' CSRF token."""

    digest: str
    account_id: str
    csrf_token: str
    created_at: int
    expires_at: int


class SignupToken(msgspec.Struct, frozen=True, kw_only=True):
    """A one-time sign-up link's digest; ``email`` fixed for an invitation, None for the first
    account's link (whoever opens it chooses)."""

    digest: str
    email: str | None
    created_at: int
    expires_at: int
    used_at: int | None


class ApiKey(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    account_id: str
    name: str
    digest: str
    created_at: int
    created_by: str  # account id of the creator
    last_used_at: int | None
    last_used_from_addr: str
    revoked_at: int | None


class Project(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    account_id: str
    name: str
    region_id: str
    pg_version: int
    provisioner: str
    store_passwords: bool
    history_retention_seconds: int
    default_endpoint_settings: dict[str, Any]
    settings: dict[str, Any]
    created_at: int
    updated_at: int
    deleted_at: int | None = None
    storage_state: str = "attached"  # attached | detached (data in the cold archive)
    locked: bool = False  # derived: true while any of its operations is unsettled


class Branch(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    project_id: str
    parent_id: str | None
    name: str
    default: bool
    protected: bool
    current_state: str  # init | resetting | ready
    pending_state: str | None
    state_changed_at: int
    created_at: int
    updated_at: int
    # Where it starts in its parent's history: the LSN (as Neon shows it) and time (us).
    parent_lsn: str | None = None
    parent_timestamp: int | None = None
    last_reset_at: int | None = None
    # When the platform deletes it (us, whole seconds), and the interval that was set for
    # (Neon's ttl_interval_seconds: a reset counts it again from the reset).
    expires_at: int | None = None
    ttl_interval_seconds: int | None = None
    # Neon's init_source: parent-data (a copy of its parent), or schema-only (a root branch
    # holding its source's roles, databases and schema, no rows).
    init_source: str = "parent-data"
    # Made by a snapshot's restore (Neon's fields): the snapshot, ``restored`` until its restore
    # is finalized (then ``finalized``), and the branch it replaces (computes, name, default).
    restored_from: str | None = None
    restore_status: str | None = None
    restored_as: str | None = None
    # Neon's anonymized branch: its computes serve once its masking ran (BranchMasking).
    anonymized: bool = False


class BranchMasking(msgspec.Struct, frozen=True, kw_only=True):
    """An anonymized branch's masking rules (Neon's MaskingRule objects, as checked) and their
    last run: ``state`` is Neon's (created, anonymizing, anonymized, error; ``initialized`` is
    shown for ``created`` once the branch's data is built)."""

    branch_id: str
    project_id: str
    masking_rules: list[dict[str, str]]
    state: str
    created_at: int
    updated_at: int
    status_message: str | None = None
    masked_columns: int | None = None
    started_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None


class Annotation(msgspec.Struct, frozen=True, kw_only=True):
    """A branch's map of strings (Neon's ``annotation_value``), as clients find branches by."""

    branch_id: str
    value: dict[str, str]
    created_at: int
    updated_at: int


class BackupCheck(msgspec.Struct, frozen=True, kw_only=True):
    """The last check that what the object store holds of a branch restores (epoch us):
    restorable to the time its newest shipped WAL was written, or ``error`` why not."""

    project_id: str
    branch_id: str
    checked_at: int
    restorable_to: int | None = None
    error: str | None = None


class Snapshot(msgspec.Struct, frozen=True, kw_only=True):
    """A branch's data at a point, kept as its own copy (Neon's snapshot).

    ``state``: ``creating`` until create_snapshot built it, then ``ready`` (or ``failed``).
    ``roles`` and ``databases``: the branch's as the store had them when it was taken, for a
    branch restored from it (roles carry their passwords: never shown to clients).
    """

    id: str
    project_id: str
    source_branch_id: str
    name: str
    state: str
    manual: bool
    roles: list[dict[str, Any]]
    databases: list[dict[str, str]]
    created_at: int
    updated_at: int
    lsn: str | None = None
    point_time: int | None = None  # the time it shows (us), when known
    full_size: int | None = None  # bytes its copy takes
    schedule_slot: str | None = None  # the backup schedule's slot it was taken for
    expires_at: int | None = None
    deleted_at: int | None = None
    slug: str | None = None  # unique among the project's live snapshots (None: taken before)


class Endpoint(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    project_id: str
    branch_id: str
    type: str  # read_write | read_only
    current_state: str  # init | active | idle
    pending_state: str | None
    port: int
    autoscaling_limit_min_cu: float
    autoscaling_limit_max_cu: float
    suspend_timeout_seconds: int
    settings: dict[str, Any]
    disabled: bool
    created_at: int
    updated_at: int
    last_active: int | None = None
    started_at: int | None = None
    suspended_at: int | None = None
    name: str | None = None  # a label the user gave it (Neon's endpoint name)


class Role(msgspec.Struct, frozen=True, kw_only=True):
    branch_id: str
    name: str
    password: str
    protected: bool
    created_at: int
    updated_at: int
    login: bool = True
    deleted_at: int | None = None  # deleted; dropped on the compute by a pending apply_config


class Database(msgspec.Struct, frozen=True, kw_only=True):
    id: int
    branch_id: str
    name: str
    owner_name: str
    created_at: int
    updated_at: int
    # The name the compute holds, until a rename is applied (None: not created there yet).
    applied_name: str | None = None
    deleted_at: int | None = None  # deleted; dropped on the compute by a pending apply_config


class Operation(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    project_id: str
    branch_id: str | None
    endpoint_id: str | None
    action: Action
    status: Status
    failures_count: int
    error: str | None
    retry_at: int | None
    created_at: int
    updated_at: int
    total_duration_ms: int
    # The branch a create_branch copies: the operation also waits for that branch's earlier work.
    source_branch_id: str | None = None
    # A rebuild from history: its point (an LSN, or a time in us) and, for a restore that keeps
    # the old state, the branch that keeps it. Never shown to clients.
    point_lsn: str | None = None
    point_time: int | None = None
    preserve_branch_id: str | None = None
    # The snapshot it builds, frees or restores from. Never shown to clients.
    snapshot_id: str | None = None
    # Engine bookkeeping, never shown to clients.
    lease_owner: str | None = None
    lease_expires_at: int | None = None
    attempt_started_at: int | None = None
    # When the first attempt started: ``total_duration_ms`` runs from there, not from creation (the
    # wait behind a project's earlier operations is theirs), and through the pauses between retries.
    started_at: int | None = None
