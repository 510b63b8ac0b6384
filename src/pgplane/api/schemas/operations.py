"""Operations and their pages."""

from __future__ import annotations

from msgspec import Struct


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
