"""Projects: what is shown of them, and what creating or changing one takes."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

from pgplane.api.schemas.common import (
    CU,
    DatabaseName,
    HistoryRetention,
    Name256,
    PgSettings,
    RoleName,
    SuspendTimeout,
)
from pgplane.api.schemas.objects import (
    BranchOut,
    ConnectionDetails,
    DatabaseOut,
    EndpointOut,
    RoleOut,
)
from pgplane.api.schemas.operations import OperationOut, Pagination


class ProjectOwner(Struct, kw_only=True):
    email: str
    name: str
    branches_limit: int
    subscription_type: str


class ProjectFields(Struct, kw_only=True, omit_defaults=True):
    """What a project shows both in lists and on its own."""

    id: str
    platform_id: str
    region_id: str
    name: str
    provisioner: str
    default_endpoint_settings: dict[str, Any]
    settings: dict[str, Any]
    pg_version: int
    proxy_host: str
    branch_logical_size_limit: int
    branch_logical_size_limit_bytes: int
    store_passwords: bool
    cpu_used_sec: int
    creation_source: str
    history_retention_seconds: int
    created_at: str
    updated_at: str
    owner_id: str
    locked: bool
    # Its branches' logical sizes and histories, summed (bytes); absent until first sampled.
    synthetic_storage_size: int | None = None


class ProjectListItem(ProjectFields, kw_only=True, omit_defaults=True):
    active_time: int
    compute_last_active_at: str | None = None


class ProjectOut(ProjectFields, kw_only=True, omit_defaults=True):
    consumption_period_start: str
    consumption_period_end: str
    owner: ProjectOwner
    data_storage_bytes_hour: int
    data_transfer_bytes: int
    written_data_bytes: int
    compute_time_seconds: int
    active_time_seconds: int
    compute_last_active_at: str | None = None
    deleted_at: str | None = None
    # Not Neon's: its branches' data and histories on disk, summed (bytes, as du counts).
    on_disk_bytes: int | None = None
    history_bytes: int | None = None


class ProjectsPage(Struct, kw_only=True, omit_defaults=True):
    projects: list[ProjectListItem]
    applications: dict[str, list[str]]
    integrations: dict[str, list[str]]
    pagination: Pagination | None = None


class ProjectResponse(Struct, kw_only=True):
    project: ProjectOut


class ProjectOperations(Struct, kw_only=True):
    project: ProjectOut
    operations: list[OperationOut]


class ProjectWarning(Struct, kw_only=True):
    code: str
    message: str


class ProjectCreated(Struct, kw_only=True, omit_defaults=True):
    project: ProjectOut
    connection_uris: list[ConnectionDetails]
    roles: list[RoleOut]
    databases: list[DatabaseOut]
    operations: list[OperationOut]
    branch: BranchOut
    endpoints: list[EndpointOut]
    # Not Neon's: what the project should know of what it got (an old Postgres major's risk).
    # Absent when there is nothing to say; clients that do not know it ignore an extra field
    # (pydantic, Go's encoding/json, neonctl's reads by name).
    warnings: list[ProjectWarning] | None = None


# -- project requests -------------------------------------------------------------------------


class BranchSpec(Struct, kw_only=True):
    name: Name256 | None = None
    role_name: RoleName | None = None
    database_name: DatabaseName | None = None


class DefaultEndpointSettings(Struct, kw_only=True, omit_defaults=True):
    pg_settings: PgSettings | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None


# Neon's free-form settings, kept as sent; allowed_ips and enable_logical_replication are
# enforced, so they are checked (services/project_settings.py).
ProjectSettings = Annotated[
    dict[str, Any],
    Meta(
        description=(
            "Project settings, kept as sent, key by key (an update changes the keys it names)."
            " allowed_ips {ips, protected_branches_only} is enforced by the proxy: each entry is"
            " an IP address, a CIDR block or a range a-b, and one that is none is a 400 naming"
            " it; an empty list allows every address; protected_branches_only applies the list"
            " to the computes of protected branches only; allowed_ips null removes the list."
            " enable_logical_replication true runs the project's computes with"
            " wal_level=logical (those running restart) and lets its roles replicate; it"
            " cannot be turned off."
        )
    ),
]


class ProjectCreateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    region_id: Annotated[str, Meta(max_length=64)] | None = None
    pg_version: Annotated[int, Meta(ge=14, le=18)] | None = None
    branch: BranchSpec | None = None
    default_endpoint_settings: DefaultEndpointSettings | None = None
    settings: ProjectSettings | None = None
    history_retention_seconds: HistoryRetention | None = None
    store_passwords: bool | None = None
    # Owned by the platform, and ignored as the contract's mass-assignment rule asks (B2).
    provisioner: Annotated[str, Meta(max_length=64)] | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None


class ProjectCreateRequest(Struct, kw_only=True):
    project: ProjectCreateSpec


class ProjectUpdateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    default_endpoint_settings: DefaultEndpointSettings | None = None
    settings: ProjectSettings | None = None
    history_retention_seconds: HistoryRetention | None = None


class ProjectUpdateRequest(Struct, kw_only=True):
    project: ProjectUpdateSpec


def to_builtins(value: Struct) -> dict[str, Any]:
    """A request sub-object as a plain dict, unset fields left out."""
    return {f: getattr(value, f) for f in value.__struct_fields__ if getattr(value, f) is not None}
