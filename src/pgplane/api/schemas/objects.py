"""A project's objects as responses show them: branches, computes, roles, databases, URIs."""

from __future__ import annotations

from msgspec import Struct


class RestrictedAction(Struct, kw_only=True):
    name: str
    reason: str


class BranchOut(Struct, kw_only=True, omit_defaults=True):
    id: str
    project_id: str
    name: str
    current_state: str
    state_changed_at: str
    creation_source: str
    primary: bool
    default: bool
    protected: bool
    cpu_used_sec: int
    compute_time_seconds: int
    active_time_seconds: int
    written_data_bytes: int
    data_transfer_bytes: int
    created_at: str
    updated_at: str
    parent_id: str | None = None
    parent_lsn: str | None = None
    parent_timestamp: str | None = None
    pending_state: str | None = None
    last_reset_at: str | None = None
    expires_at: str | None = None
    ttl_interval_seconds: int | None = None
    init_source: str | None = None  # parent-data, or schema-only (a root branch, no parent)
    # A branch a snapshot was restored into: the snapshot, restored (waiting to be finalized) or
    # finalized, and the branch it replaces.
    restored_from: str | None = None
    restore_status: str | None = None
    restored_as: str | None = None
    # An anonymized branch's (Neon's): what it cannot be used for, and why.
    restricted_actions: list[RestrictedAction] | None = None
    logical_size: int | None = None  # bytes, as Postgres last reported them (absent: unknown)
    # Not Neon's: the blocks its data and its history (WAL archive, base states) take on disk,
    # as du counts them. Clients that do not know them ignore extra fields.
    on_disk_bytes: int | None = None
    history_bytes: int | None = None


class AnnotationObject(Struct, kw_only=True):
    type: str
    id: str


class AnnotationOut(Struct, kw_only=True, omit_defaults=True):
    """Neon's AnnotationData: what a branch is annotated with, and since when."""

    object: AnnotationObject
    value: dict[str, str]
    created_at: str | None = None
    updated_at: str | None = None


class EndpointSettings(Struct, kw_only=True):
    pg_settings: dict[str, str]


class EndpointOut(Struct, kw_only=True, omit_defaults=True):
    host: str
    id: str
    project_id: str
    branch_id: str
    autoscaling_limit_min_cu: float
    autoscaling_limit_max_cu: float
    region_id: str
    type: str
    current_state: str
    settings: EndpointSettings
    pooler_enabled: bool
    pooler_mode: str
    disabled: bool
    passwordless_access: bool
    creation_source: str
    created_at: str
    updated_at: str
    proxy_host: str
    suspend_timeout_seconds: int
    provisioner: str
    pending_state: str | None = None
    last_active: str | None = None
    started_at: str | None = None
    suspended_at: str | None = None
    # Not Neon's (its endpoints carry no usage): this compute's own share of its branch's and
    # project's figures, in the same names. Absent until it first ran.
    cpu_used_sec: int | None = None
    compute_time_seconds: int | None = None
    active_time_seconds: int | None = None
    name: str | None = None  # the label the user gave it, when there is one


class RoleOut(Struct, kw_only=True, omit_defaults=True):
    branch_id: str
    name: str
    protected: bool
    created_at: str
    updated_at: str
    password: str | None = None


class DatabaseOut(Struct, kw_only=True):
    id: int
    branch_id: str
    name: str
    owner_name: str
    created_at: str
    updated_at: str


class ConnectionParameters(Struct, kw_only=True, omit_defaults=True):
    """Neon's fields, and what a client needs apart besides (PGHOST, PGPORT, PGOPTIONS): the
    host is the name alone, the proxy's port beside it, and ``options`` names the endpoint when
    the host does not (a proxy without wildcard DNS)."""

    database: str
    password: str
    role: str
    host: str
    pooler_host: str
    port: int
    options: str | None = None


class ConnectionDetails(Struct, kw_only=True):
    connection_uri: str
    connection_parameters: ConnectionParameters
