"""Branches: pages of them, and what creating, restoring or changing one takes."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from pgplane.api.schemas.common import (
    CU,
    EndpointType,
    Name256,
    PgSettings,
    Provisioner,
    SuspendTimeout,
    documented,
)
from pgplane.api.schemas.objects import (
    AnnotationOut,
    BranchOut,
    ConnectionDetails,
    DatabaseOut,
    EndpointOut,
    RoleOut,
)
from pgplane.api.schemas.operations import OperationOut
from pgplane.services import history
from pgplane.services.annotations import MAX_ENTRIES, MAX_KEY, MAX_VALUE


class BranchPagination(Struct, kw_only=True, omit_defaults=True):
    sort_by: str
    sort_order: str
    next: str | None = None


class BranchesPage(Struct, kw_only=True, omit_defaults=True):
    branches: list[BranchOut]
    # Neon's annotations by branch id; always present (neonctl's table output reads it).
    annotations: dict[str, AnnotationOut]
    pagination: BranchPagination | None = None


class BranchCount(Struct, kw_only=True):
    count: int


class BranchSchemaResponse(Struct, kw_only=True):
    """Neon's ``BranchSchemaResponse``: the database's schema as SQL (pg_dump --schema-only)."""

    sql: str


class BranchSchemaCompareResponse(Struct, kw_only=True):
    """Neon's ``BranchSchemaCompareResponse``: a unified diff, empty when the schemas agree."""

    diff: str


class BranchResponse(Struct, kw_only=True):
    branch: BranchOut
    annotation: AnnotationOut


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


class EndpointSettingsIn(Struct, kw_only=True, forbid_unknown_fields=True):
    pg_settings: PgSettings | None = None


# A point of a branch's history: an LSN as Postgres prints it, or an RFC 3339 time.
Lsn = Annotated[
    str,
    Meta(
        max_length=17,
        description="an LSN of the branch's history, such as 0/1A2B3C4D",
        extra_json_schema=documented(pattern=history.LSN_PATTERN),
    ),
]
Timestamp = Annotated[
    str,
    Meta(
        max_length=40,
        description="an RFC 3339 time within the project's history window",
        extra_json_schema=documented(format="date-time", pattern=history.TIME_PATTERN),
    ),
]
ExpiresAt = Annotated[
    str,
    Meta(
        max_length=40,
        description=(
            "an RFC 3339 time, in the future and at most 30 days ahead, when the platform"
            " deletes the branch (kept to the second)"
        ),
        extra_json_schema=documented(format="date-time", pattern=history.TIME_PATTERN),
    ),
]


class BranchEndpointSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    type: EndpointType
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Provisioner | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None


class BranchCreateSpec(Struct, kw_only=True, forbid_unknown_fields=True):
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
                extra_json_schema=documented(enum=[False, None]),
            ),
        ]
        | None
    ) = None
    # schema-only: a new root branch with the source's roles, databases and schema, no rows.
    init_source: Literal["parent-data", "schema-only"] | None = None
    expires_at: ExpiresAt | None = None


# Neon's AnnotationValueData: at most 50 entries; the lengths are pgplane's (Neon states none).
AnnotationValue = Annotated[
    dict[
        Annotated[str, Meta(min_length=1, max_length=MAX_KEY)],
        Annotated[str, Meta(max_length=MAX_VALUE)],
    ],
    Meta(
        max_length=MAX_ENTRIES,
        description="a map of strings kept with the branch, returned as its annotation",
        # The keys' lengths, which the document would not say otherwise (msgspec checks them).
        extra_json_schema=documented(propertyNames={"minLength": 1, "maxLength": MAX_KEY}),
    ),
]


class BranchCreateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    branch: BranchCreateSpec | None = None
    endpoints: Annotated[list[BranchEndpointSpec], Meta(max_length=10)] | None = None
    annotation_value: AnnotationValue | None = None


class BranchRestoreRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    source_branch_id: Annotated[str, Meta(min_length=1, max_length=60)]
    source_lsn: Lsn | None = None
    source_timestamp: Timestamp | None = None
    preserve_under_name: Name256 | None = None


class BranchUpdateSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    name: Name256 | None = None
    protected: bool | None = None
    # Absent: unchanged; null: the branch no longer expires.
    expires_at: ExpiresAt | UnsetType | None = UNSET


class BranchUpdateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    branch: BranchUpdateSpec
    # pgplane's, beside Neon's fields as on create: replaces the annotation ({} removes it).
    annotation_value: AnnotationValue | None = None
