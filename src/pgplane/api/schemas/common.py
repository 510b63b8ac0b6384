"""Types the shapes share: names, settings, compute units, and the error body."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from pgplane.services import compute_settings, names


def documented(**rules: Any) -> dict[str, Any]:
    """JSON Schema rules for the document only: the services enforce them, in their own words
    (see services/names.py); msgspec's constraints would refuse first, in its words."""
    return {"extra": rules}


def _not(pattern: str) -> dict[str, str]:
    return {"type": "string", "pattern": pattern}


Name256 = Annotated[
    str,
    Meta(min_length=1, max_length=256, extra_json_schema=documented(pattern=names.NAME_PATTERN)),
]
# Role and database names: at most 63 bytes too (Postgres' limit), which JSON Schema cannot say.
Identifier = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=63,
        extra_json_schema=documented(pattern=names.IDENTIFIER_PATTERN),
    ),
]


def _identifier_but(reserved: str) -> Meta:
    """An Identifier that is not one of the names the platform keeps for itself."""
    return Meta(
        min_length=1,
        max_length=63,
        extra_json_schema=documented(pattern=names.IDENTIFIER_PATTERN, schema_not=_not(reserved)),
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
        extra_json_schema=documented(
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
HistoryRetention = Annotated[int, Meta(ge=0, le=2592000, extra_json_schema=documented(minimum=0))]
# Neon's names for what runs a compute. This platform has one kind, a process in a sandbox and a
# cgroup whose CPU moves within the endpoint's CU range (as Neon's autoscaled VMs, k8s-neonvm,
# which Neon's MCP server always asks for); it takes either name for it and shows it as Neon's
# pods. Another value is a 400 naming the field rather than a request quietly not kept.
Provisioner = Annotated[
    Literal["k8s-pod", "k8s-neonvm"],
    Meta(
        description="what runs the compute: both name the one kind this platform has, a"
        " sandboxed process whose CPU moves within the endpoint's CU range"
    ),
]
# Neon's pooler setting: the only mode its API accepts, and the one the -pooler host serves.
PoolerMode = Annotated[Literal["transaction"], Meta(description="transaction, the only mode")]
# Neon's on/off switches this platform does not have: false (or absent) is what holds here;
# true is a 400 naming the field (api/unserved.py), never a setting quietly dropped.
OffOnly = Annotated[
    bool,
    Meta(
        description="not served here: false or absent",
        extra_json_schema=documented(enum=[False, None]),
    ),
]

EndpointType = Annotated[
    Literal["read_write", "read_only"],
    Meta(
        description=(
            "read_write: the branch's one writable compute; read_only: a hot standby of the"
            " branch (several per branch) that follows its writes and refuses its own"
        )
    ),
]


class ErrorBody(Struct, kw_only=True):
    code: str
    message: str
    request_id: str
