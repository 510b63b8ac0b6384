"""Request and response models: the API's shapes, separate from the store's records.

Responses are supersets: the contract's fields plus those current Neon clients require. Secrets
reach a response only through the models that exist to carry them (a created key's value, a
role's password in create responses). Optional fields are omitted when unset, as Neon omits
``endpoint_id`` on operations that involve no compute.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from pgplane.services import compute_settings, names


def _documented(**rules: Any) -> dict[str, Any]:
    """JSON Schema rules for the document only: the services enforce them, in their own words
    (see services/names.py); msgspec's constraints would refuse first, in its words."""
    return {"extra": rules}


def _not(pattern: str) -> dict[str, str]:
    return {"type": "string", "pattern": pattern}


Name256 = Annotated[
    str,
    Meta(min_length=1, max_length=256, extra_json_schema=_documented(pattern=names.NAME_PATTERN)),
]
# Role and database names: at most 63 bytes too (Postgres' limit), which JSON Schema cannot say.
Identifier = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=63,
        extra_json_schema=_documented(pattern=names.IDENTIFIER_PATTERN),
    ),
]


def _identifier_but(reserved: str) -> Meta:
    """An Identifier that is not one of the names the platform keeps for itself."""
    return Meta(
        min_length=1,
        max_length=63,
        extra_json_schema=_documented(pattern=names.IDENTIFIER_PATTERN, schema_not=_not(reserved)),
    )


RoleName = Annotated[str, _identifier_but(names.RESERVED_ROLE_PATTERN)]
DatabaseName = Annotated[str, _identifier_but(names.RESERVED_DATABASE_PATTERN)]
# Postgres settings a compute takes (services/compute_settings.py decides which).
PgSettings = Annotated[
    dict[str, str],
    Meta(
        description=(
            "Postgres settings of the compute, as Postgres spells them. Each value is read by"
            " the compute's Postgres version before it is accepted (type, unit, range,"
            " choices); one it does not accept is a 400 and changes nothing."
        ),
        extra_json_schema=_documented(
            property_names={"pattern": compute_settings.SETTING_NAME_PATTERN},
            additional_properties={
                "type": "string",
                "maxLength": compute_settings.MAX_SETTING_VALUE,
                "pattern": compute_settings.SETTING_VALUE_PATTERN,
            },
        ),
    ),
]
# Compute units: quarters from 0.25 to 16.
CU = Annotated[float, Meta(ge=0.25, le=16, multiple_of=0.25)]
SuspendTimeout = Annotated[int, Meta(ge=-1, le=604800)]
# Litestar leaves a bound of 0 out of the document (it tests the bound for truth): restated.
HistoryRetention = Annotated[int, Meta(ge=0, le=2592000, extra_json_schema=_documented(minimum=0))]
EndpointType = Annotated[
    Literal["read_write"],
    Meta(description="read_only computes need replicas, which this platform does not run yet"),
]


class ErrorBody(Struct, kw_only=True):
    code: str
    message: str
    request_id: str


# -- API keys ---------------------------------------------------------------------------------


class ApiKeyCreateRequest(Struct, kw_only=True):
    key_name: Annotated[
        str,
        Meta(
            min_length=1, max_length=64, extra_json_schema=_documented(pattern=names.NAME_PATTERN)
        ),
    ]


class ApiKeyCreated(Struct, kw_only=True):
    id: int
    key: str
    name: str
    created_at: str
    created_by: str


class ApiKeyCreator(Struct, kw_only=True):
    id: str
    name: str
    image: str


class ApiKeyListItem(Struct, kw_only=True):
    id: int
    name: str
    created_at: str
    created_by: ApiKeyCreator
    last_used_at: str | None
    last_used_from_addr: str


class ApiKeyRevoked(Struct, kw_only=True):
    id: int
    name: str
    created_at: str
    created_by: str
    last_used_at: str | None
    last_used_from_addr: str
    revoked: bool


# -- operations -------------------------------------------------------------------------------


class OperationOut(Struct, kw_only=True, omit_defaults=True):
    id: str
    project_id: str
    action: str
    status: str
    failures_count: int
    created_at: str
    updated_at: str
    total_duration_ms: int
    branch_id: str | None = None
    endpoint_id: str | None = None
    error: str | None = None
    retry_at: str | None = None


class Pagination(Struct, kw_only=True):
    cursor: str


class OperationsPage(Struct, kw_only=True, omit_defaults=True):
    operations: list[OperationOut]
    pagination: Pagination | None = None


class OperationResponse(Struct, kw_only=True):
    operation: OperationOut


# -- projects ---------------------------------------------------------------------------------


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


class ConnectionParameters(Struct, kw_only=True):
    database: str
    password: str
    role: str
    host: str
    pooler_host: str


class ConnectionDetails(Struct, kw_only=True):
    connection_uri: str
    connection_parameters: ConnectionParameters


class ProjectCreated(Struct, kw_only=True):
    project: ProjectOut
    connection_uris: list[ConnectionDetails]
    roles: list[RoleOut]
    databases: list[DatabaseOut]
    operations: list[OperationOut]
    branch: BranchOut
    endpoints: list[EndpointOut]


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


class ProjectCreateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    region_id: Annotated[str, Meta(max_length=64)] | None = None
    pg_version: Annotated[int, Meta(ge=14, le=18)] | None = None
    branch: BranchSpec | None = None
    default_endpoint_settings: DefaultEndpointSettings | None = None
    settings: dict[str, Any] | None = None
    history_retention_seconds: HistoryRetention | None = None
    store_passwords: bool | None = None
    provisioner: Annotated[str, Meta(max_length=64)] | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None


class ProjectCreateRequest(Struct, kw_only=True):
    project: ProjectCreateSpec


class ProjectUpdateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    default_endpoint_settings: DefaultEndpointSettings | None = None
    settings: dict[str, Any] | None = None
    history_retention_seconds: HistoryRetention | None = None


class ProjectUpdateRequest(Struct, kw_only=True):
    project: ProjectUpdateSpec


def to_builtins(value: Struct) -> dict[str, Any]:
    """A request sub-object as a plain dict, unset fields left out."""
    return {f: getattr(value, f) for f in value.__struct_fields__ if getattr(value, f) is not None}


# -- branches ---------------------------------------------------------------------------------


class BranchPagination(Struct, kw_only=True, omit_defaults=True):
    sort_by: str
    sort_order: str
    next: str | None = None


class BranchesPage(Struct, kw_only=True, omit_defaults=True):
    branches: list[BranchOut]
    # Neon's annotations by branch id; always present (neonctl's table output reads it).
    annotations: dict[str, Any]
    pagination: BranchPagination | None = None


class BranchCount(Struct, kw_only=True):
    count: int


class BranchResponse(Struct, kw_only=True):
    branch: BranchOut


class BranchOperations(Struct, kw_only=True):
    branch: BranchOut
    operations: list[OperationOut]


class BranchCreated(Struct, kw_only=True, omit_defaults=True):
    branch: BranchOut
    endpoints: list[EndpointOut]
    operations: list[OperationOut]
    roles: list[RoleOut]
    databases: list[DatabaseOut]
    connection_uris: list[ConnectionDetails] | None = None


class EndpointSettingsIn(Struct, kw_only=True):
    pg_settings: PgSettings | None = None


# A point of a branch's history: an LSN as Postgres prints it, or an RFC 3339 time.
Lsn = Annotated[
    str,
    Meta(
        max_length=17,
        pattern=r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$",
        description="an LSN of the branch's history, such as 0/1A2B3C4D",
    ),
]
Timestamp = Annotated[
    str,
    Meta(
        max_length=40,
        description="an RFC 3339 time within the project's history window",
        extra_json_schema={"format": "date-time"},
    ),
]


class BranchEndpointSpec(Struct, kw_only=True):
    type: EndpointType
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Annotated[str, Meta(max_length=64)] | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None


class BranchCreateSpec(Struct, kw_only=True):
    parent_id: Annotated[str, Meta(max_length=60)] | None = None
    name: Name256 | None = None
    # A point of the parent's history rather than its head (one of the two).
    parent_lsn: Lsn | None = None
    parent_timestamp: Timestamp | None = None
    protected: bool | None = None
    archived: (
        Annotated[
            bool,
            Meta(
                description="archiving branches is not supported: false or null",
                extra_json_schema=_documented(enum=[False, None]),
            ),
        ]
        | None
    ) = None
    init_source: Literal["parent-data"] | None = None
    expires_at: Annotated[None, Meta(description="expiring branches are not supported yet")] = None


class BranchCreateRequest(Struct, kw_only=True):
    branch: BranchCreateSpec | None = None
    endpoints: Annotated[list[BranchEndpointSpec], Meta(max_length=10)] | None = None
    annotation_value: Annotated[dict[str, str], Meta(max_length=50)] | None = None


class BranchRestoreRequest(Struct, kw_only=True):
    source_branch_id: Annotated[str, Meta(min_length=1, max_length=60)]
    source_lsn: Lsn | None = None
    source_timestamp: Timestamp | None = None
    preserve_under_name: Name256 | None = None


class BranchUpdateSpec(Struct, kw_only=True):
    name: Name256 | None = None
    protected: bool | None = None
    expires_at: Annotated[None, Meta(description="expiring branches are not supported yet")] = None


class BranchUpdateRequest(Struct, kw_only=True):
    branch: BranchUpdateSpec


# -- endpoints --------------------------------------------------------------------------------


class EndpointsResponse(Struct, kw_only=True):
    endpoints: list[EndpointOut]


class EndpointResponse(Struct, kw_only=True):
    endpoint: EndpointOut


class EndpointOperations(Struct, kw_only=True):
    endpoint: EndpointOut
    operations: list[OperationOut]


class EndpointCreateSpec(Struct, kw_only=True):
    branch_id: Annotated[str, Meta(min_length=1, max_length=60)]
    type: EndpointType
    region_id: Annotated[str, Meta(max_length=64)] | None = None
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Annotated[str, Meta(max_length=64)] | None = None
    pooler_enabled: bool | None = None
    pooler_mode: Annotated[str, Meta(max_length=16)] | None = None
    disabled: bool | None = None
    passwordless_access: bool | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None
    name: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class EndpointCreateRequest(Struct, kw_only=True):
    endpoint: EndpointCreateSpec


class EndpointUpdateSpec(Struct, kw_only=True):
    branch_id: Annotated[str, Meta(min_length=1, max_length=60)] | None = None
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Annotated[str, Meta(max_length=64)] | None = None
    pooler_enabled: bool | None = None
    pooler_mode: Annotated[str, Meta(max_length=16)] | None = None
    disabled: bool | None = None
    passwordless_access: bool | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None
    name: Annotated[str, Meta(min_length=1, max_length=64)] | None = None


class EndpointUpdateRequest(Struct, kw_only=True):
    endpoint: EndpointUpdateSpec


# -- roles and databases ----------------------------------------------------------------------


class RolesResponse(Struct, kw_only=True):
    roles: list[RoleOut]


class RoleResponse(Struct, kw_only=True):
    role: RoleOut


class RoleOperations(Struct, kw_only=True):
    role: RoleOut
    operations: list[OperationOut]


class RolePassword(Struct, kw_only=True):
    password: str


class RoleCreateSpec(Struct, kw_only=True):
    name: RoleName
    no_login: bool | None = None


class RoleCreateRequest(Struct, kw_only=True):
    role: RoleCreateSpec


class DatabasesResponse(Struct, kw_only=True):
    databases: list[DatabaseOut]


class DatabaseResponse(Struct, kw_only=True):
    database: DatabaseOut


class DatabaseOperations(Struct, kw_only=True):
    database: DatabaseOut
    operations: list[OperationOut]


class DatabaseCreateSpec(Struct, kw_only=True):
    name: DatabaseName
    owner_name: Identifier


class DatabaseCreateRequest(Struct, kw_only=True):
    database: DatabaseCreateSpec


class DatabaseUpdateSpec(Struct, kw_only=True):
    name: DatabaseName | None = None
    owner_name: Identifier | None = None


class DatabaseUpdateRequest(Struct, kw_only=True):
    database: DatabaseUpdateSpec


class ConnectionURI(Struct, kw_only=True):
    uri: str


# -- who is asking, and where ----------------------------------------------------------------


class AuthInfo(Struct, kw_only=True):
    account_id: str
    auth_method: str
    auth_data: str


class AuthAccount(Struct, kw_only=True):
    email: str
    image: str
    login: str
    name: str
    provider: str


class PaymentSource(Struct, kw_only=True):
    type: str


class BillingAccount(Struct, kw_only=True):
    state: str
    payment_source: PaymentSource
    subscription_type: str
    payment_method: str
    quota_reset_at_last: str
    name: str
    email: str
    address_city: str
    address_country: str
    address_line1: str
    address_line2: str
    address_postal_code: str
    address_state: str


class CurrentUser(Struct, kw_only=True):
    active_seconds_limit: int
    billing_account: BillingAccount
    auth_accounts: list[AuthAccount]
    email: str
    id: str
    image: str
    login: str
    name: str
    last_name: str
    projects_limit: int
    branches_limit: int
    max_autoscaling_limit: float
    plan: str


class Organizations(Struct, kw_only=True):
    organizations: list[dict[str, Any]]


class Region(Struct, kw_only=True):
    region_id: str
    name: str
    default: bool
    geo_lat: str
    geo_long: str


class Regions(Struct, kw_only=True):
    regions: list[Region]
