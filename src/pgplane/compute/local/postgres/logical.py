"""Logical replication on a compute: Neon's ``enable_logical_replication``.

The compute runs with ``wal_level=logical`` and the project's roles have REPLICATION (given
with their other attributes, :func:`..sessions.role_attributes`), so the owner may create
publications and slots and an external subscriber streams changes through the proxy (a logical
replication connection names its database: ``pg_hba``'s ``all`` line takes it, over the socket
the proxy reaches once it has checked the password; physical replication stays refused).

A slot keeps every WAL file its subscriber has not confirmed. One whose subscriber went away
would fill the project's disk share, so Postgres itself bounds it: past :data:`SLOT_WAL_KEEP_MB`
MiB of WAL (``max_slot_wal_keep_size``), or idle for :data:`SLOT_IDLE_TIMEOUT` (Postgres 18's
``idle_replication_slot_timeout``, as Neon drops a slot inactive for about 40 hours), the slot
is invalidated and its WAL freed; the subscriber that comes back is told why, in Postgres' own
words. The platform logs each inactive slot keeping much WAL as it samples the branch's sizes
(:func:`..monitor.figures`, compute/local/storage.py).
"""

from __future__ import annotations

from pgplane.compute.model import ComputeSpec

# The most WAL a slot keeps; more than the archive receiver's own slot may (shared/receiver.py:
# the setting is one for every slot on the compute).
SLOT_WAL_KEEP_MB = 4096
SLOT_IDLE_TIMEOUT = "40h"
_IDLE_TIMEOUT_SINCE = 18  # the major that has idle_replication_slot_timeout


def logical_settings(pg_version: int) -> dict[str, str]:
    """The settings a compute of a project with logical replication runs with."""
    settings = {"max_slot_wal_keep_size": f"{SLOT_WAL_KEEP_MB}MB"}
    if pg_version >= _IDLE_TIMEOUT_SINCE:
        settings["idle_replication_slot_timeout"] = SLOT_IDLE_TIMEOUT
    return settings


def wal_level(spec: ComputeSpec) -> str | None:
    """The compute's ``wal_level``: ``logical`` with its project's logical replication, else
    Postgres' default (None: left off the command line, which is then the same as before the
    setting existed, so an upgrade restarts no compute for it)."""
    return "logical" if spec.logical_replication else None
