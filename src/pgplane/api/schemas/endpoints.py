"""Computes (endpoints): what creating or changing one takes."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from pgplane.api.schemas.branches import EndpointSettingsIn
from pgplane.api.schemas.common import (
    CU,
    EndpointType,
    OffOnly,
    PoolerMode,
    Provisioner,
    SuspendTimeout,
    documented,
)
from pgplane.api.schemas.objects import EndpointOut
from pgplane.api.schemas.operations import OperationOut
from pgplane.services import names

# Neon's compute name: a label, not unique; the id still names the compute in hosts.
# services/names.py refuses control characters too: documented, as for other names.
EndpointName = Annotated[
    str, Meta(min_length=1, max_length=64, extra_json_schema=documented(pattern=names.NAME_PATTERN))
]


class EndpointsResponse(Struct, kw_only=True):
    endpoints: list[EndpointOut]


class EndpointResponse(Struct, kw_only=True):
    endpoint: EndpointOut


class EndpointOperations(Struct, kw_only=True):
    endpoint: EndpointOut
    operations: list[OperationOut]


class EndpointCreateSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    branch_id: Annotated[str, Meta(min_length=1, max_length=60)]
    type: EndpointType
    region_id: Annotated[str, Meta(max_length=64)] | None = None
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Provisioner | None = None
    pooler_enabled: OffOnly | None = None
    pooler_mode: PoolerMode | None = None
    disabled: bool | None = None
    passwordless_access: OffOnly | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None
    name: EndpointName | None = None


class EndpointCreateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: EndpointCreateSpec


class EndpointUpdateSpec(Struct, kw_only=True, forbid_unknown_fields=True):
    branch_id: Annotated[str, Meta(min_length=1, max_length=60)] | None = None
    settings: EndpointSettingsIn | None = None
    autoscaling_limit_min_cu: CU | None = None
    autoscaling_limit_max_cu: CU | None = None
    provisioner: Provisioner | None = None
    pooler_enabled: OffOnly | None = None
    pooler_mode: PoolerMode | None = None
    disabled: bool | None = None
    passwordless_access: OffOnly | None = None
    suspend_timeout_seconds: SuspendTimeout | None = None
    name: EndpointName | None = None


class EndpointUpdateRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    endpoint: EndpointUpdateSpec
