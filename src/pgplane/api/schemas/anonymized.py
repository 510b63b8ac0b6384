"""Anonymized branches, in Neon's shapes (its ``branch_anonymized``, still beta there)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from pgplane.api.schemas.branches import AnnotationValue, BranchCreateRequest

_Name = Annotated[str, Meta(min_length=1, max_length=63)]


class MaskingRule(Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """Neon's MaskingRule; one of masking_function (an expression of the offered functions,
    core/masking.py, which checks it with messages naming the rule) or masking_value."""

    database_name: _Name
    schema_name: _Name
    table_name: _Name
    column_name: _Name
    masking_function: Annotated[str, Meta(max_length=1000)] | None = None
    masking_value: str | None = None


MaskingRules = Annotated[list[MaskingRule], Meta(max_length=1000)]


class BranchAnonymizedCreateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    branch_create: BranchCreateRequest | None = None
    masking_rules: MaskingRules | None = None
    start_anonymization: bool = False
    annotation_value: AnnotationValue | None = None


class MaskingRulesResponse(Struct, kw_only=True):
    masking_rules: list[dict[str, str]]


class MaskingRulesUpdateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    masking_rules: MaskingRules


class AnonymizationRun(Struct, kw_only=True, omit_defaults=True):
    started_at: str | None = None
    completed_at: str | None = None
    masked_columns: int | None = None


class AnonymizedBranchStatus(Struct, kw_only=True, omit_defaults=True):
    project_id: str
    branch_id: str
    state: str
    created_at: str
    updated_at: str
    status_message: str | None = None
    failed_at: str | None = None
    last_run: AnonymizationRun | None = None
