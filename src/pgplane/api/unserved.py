"""Neon's switches this platform does not have, refused when turned on, never quietly dropped.

Each is accepted as false (what holds here, and what the platform returns) so that clients which
send Neon's defaults keep working; true is a 400 that names the field and says why.
"""

from __future__ import annotations

from msgspec import Struct

from pgplane.errors import BadRequest

_WHY = {
    "pooler_enabled": (
        "there is no pooler to switch on: every compute also answers at its -pooler host"
        " (ep-…-pooler.<host>), Neon's pooled connection string, in session mode"
    ),
    "passwordless_access": "passwordless access is not served: connect with a role's password",
}


def refuse_switches(spec: Struct, where: str) -> None:
    """A 400 naming ``<where>.<field>`` for the first unserved switch ``spec`` turns on."""
    for field, why in _WHY.items():
        if getattr(spec, field, None):
            raise BadRequest(f"{where}.{field}: {why}")
