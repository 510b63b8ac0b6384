"""A project's ``settings`` as set on create and update; ``allowed_ips`` checked, as it is enforced.

``settings`` is Neon's free-form object and is kept as sent, key by key, except what the
platform enforces, which is checked:

- ``allowed_ips`` ({``ips``, ``protected_branches_only``}), which the proxy enforces
  (:mod:`pgplane.core.ipallow`): an entry it could not read, or a field it could not honour, is
  a 400 naming the field, so the list shown is the list enforced. ``protected_branches_only:
  true`` means, as on Neon, that the list applies to the computes of protected branches only
  and the other branches take connections from anywhere.
- ``enable_logical_replication``: the project's computes run with ``wal_level=logical`` and its
  roles may replicate (Neon's behaviour). As on Neon it cannot be turned off: a logical slot
  makes a compute with a lower ``wal_level`` refuse to start.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pgplane.core import ipallow
from pgplane.errors import BadRequest

ALLOWED_IPS = "allowed_ips"
LOGICAL_REPLICATION = "enable_logical_replication"
# Each connection is tried against every entry, on the proxy's one event loop.
MAX_ALLOWED_IPS = 1000
_FIELDS = ("ips", "protected_branches_only")
_AT = f"settings.{ALLOWED_IPS}"


def updated(current: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """``current`` with ``changes`` applied key by key (a key left out keeps its value), as an
    update sets them; ``allowed_ips: null`` removes the list. BadRequest for a bad list."""
    merged = {**current, **changes}
    if ALLOWED_IPS in changes:
        if changes[ALLOWED_IPS] is None:
            merged.pop(ALLOWED_IPS)
        else:
            merged[ALLOWED_IPS] = _allowed_ips(changes[ALLOWED_IPS], current.get(ALLOWED_IPS))
    if LOGICAL_REPLICATION in changes:
        wanted = changes[LOGICAL_REPLICATION]
        if not isinstance(wanted, bool):
            raise BadRequest(f"settings.{LOGICAL_REPLICATION}: must be true or false")
        if logical_replication(current) and not wanted:
            raise BadRequest(
                f"settings.{LOGICAL_REPLICATION}: logical replication cannot be turned off once"
                " enabled (its replication slots need wal_level=logical)"
            )
    return merged


def logical_replication(settings: Mapping[str, Any]) -> bool:
    """Whether the project's computes run with ``wal_level=logical``."""
    return settings.get(LOGICAL_REPLICATION) is True


def turns_on_logical_replication(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    return logical_replication(after) and not logical_replication(before)


def new(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A new project's settings, as sent but for a checked ``allowed_ips``."""
    return updated({}, settings)


def _allowed_ips(value: object, current: object) -> dict[str, Any]:
    """The list as stored and shown, Neon's shape with both fields; a field left out of an
    update keeps its value."""
    if not isinstance(value, dict):
        raise BadRequest(f"{_AT}: must be an object with ips and protected_branches_only")
    for key in value:
        if key not in _FIELDS:
            raise BadRequest(
                f"{_AT}.{key}: not offered here; allowed_ips takes ips and protected_branches_only"
            )
    before = current if isinstance(current, dict) else {}
    ips = value.get("ips", before.get("ips", []))
    only_protected = value.get(
        "protected_branches_only", before.get("protected_branches_only", False)
    )
    if ips is None:
        ips = []
    if not isinstance(ips, list):
        raise BadRequest(f"{_AT}.ips: must be an array of IP addresses, CIDR blocks or ranges")
    if len(ips) > MAX_ALLOWED_IPS:
        raise BadRequest(f"{_AT}.ips: at most {MAX_ALLOWED_IPS} entries")
    for i, entry in enumerate(ips):
        if not isinstance(entry, str):
            raise BadRequest(f"{_AT}.ips[{i}]: must be a string")
        try:
            ipallow.parse_entry(entry)
        except ipallow.BadEntry as exc:
            raise BadRequest(
                f"{_AT}.ips[{i}]: {exc}; give an IP address (203.0.113.7), a CIDR block"
                " (203.0.113.0/24) or a range (203.0.113.7-203.0.113.9)"
            ) from None
    if not isinstance(only_protected, bool):
        raise BadRequest(f"{_AT}.protected_branches_only: must be true or false")
    return {"ips": list(ips), "protected_branches_only": only_protected}


def protected_only(settings: Mapping[str, Any]) -> bool:
    """Whether the project's list applies to protected branches only (so a connection's branch
    decides, and must be read)."""
    found = settings.get(ALLOWED_IPS)
    return isinstance(found, dict) and found.get("protected_branches_only") is True


def allow_list(settings: Mapping[str, Any], *, protected_branch: bool) -> ipallow.AllowList:
    """The list that applies to a compute of a branch (protected or not) of a project with these
    settings: the project's, or everyone's when it applies to protected branches only."""
    found = settings.get(ALLOWED_IPS)
    if not isinstance(found, dict) or not found.get("ips"):
        return ipallow.ALLOW_ALL
    if protected_only(settings) and not protected_branch:
        return ipallow.ALLOW_ALL
    ips = found["ips"]
    # Stored before lists were checked, it may be anything; what cannot be read matches nothing.
    return ipallow.allow_list(str(e) for e in (ips if isinstance(ips, list) else [ips]))
