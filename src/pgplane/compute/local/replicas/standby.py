"""A read-only compute's command line: a hot standby of its branch, told where its WAL comes from.

Two sources, as Postgres' own standby alternates between them:

- streaming from the branch's read-write compute while it runs: ``primary_conninfo`` names the
  socket that compute also keeps in the branch's replication socket directory
  (``Layout.wal_socket_dir``), as the platform's superuser, trusted there by the platform's
  ``pg_hba.conf`` (replication over the socket only). No password exists to reuse: reaching
  the socket is the credential, and only the project's own OS user can (0700), inside a sandbox
  that mounts no other branch's socket and has no network;
- the branch's WAL archive (``restore_command``), mounted read-only into the replica's sandbox
  and read there by the project's own user (``cp``), never by root: a segment a tenant forged
  in its own archive reaches only its own replica.

Everything the tenant could override is on the command line, which outranks
``postgresql.auto.conf`` (an ``ALTER SYSTEM`` or a file a tenant holding the OS user wrote).

A standby refuses to replay WAL from a primary whose ``max_connections`` (and a few more) is
larger than its own: those settings are raised to what the copy's control file says the primary
had (``pg_controldata``, run as the project's user on the replica's own copy, its values
bounded: a forged control file can only make the tenant's own replica larger, within its
cgroup).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path

from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.sessions import ADMIN_USER
from pgplane.compute.local.tenants.user import C_LOCALE, RunAs

_CONTROLDATA_TIMEOUT = 30.0
# Settings a standby must hold at least at the primary's values (pg_controldata's labels), with
# the bounds Postgres itself puts on each.
MINIMA = {
    "max_connections": ("max_connections setting", 262143),
    "max_worker_processes": ("max_worker_processes setting", 262143),
    "max_wal_senders": ("max_wal_senders setting", 262143),
    "max_prepared_transactions": ("max_prepared_xacts setting", 262143),
    "max_locks_per_transaction": ("max_locks_per_xact setting", 2147483647),
}
# How often a standby that lost its stream tries the archive and the primary again (Postgres'
# default is 5 s): a suspended primary's last WAL is seen within about this.
RETRY_INTERVAL = "1s"


async def primary_minima(install: PgInstall, run_as: RunAs, pgdata: Path) -> dict[str, int]:
    """The primary's values of :data:`MINIMA`, from the copy's control file."""
    binary = install.bin_dir / "pg_controldata"
    out = await run_as.run([binary, "-D", pgdata], time_limit=_CONTROLDATA_TIMEOUT, env=C_LOCALE)
    return parse_minima(out)


def parse_minima(out: str) -> dict[str, int]:
    labels = {label: (name, bound) for name, (label, bound) in MINIMA.items()}
    found: dict[str, int] = {}
    for line in out.splitlines()[:200]:
        key, sep, value = line.partition(":")
        entry = labels.get(key.strip())
        if sep and entry is not None and value.strip().isdigit():
            name, bound = entry
            found[name] = min(int(value.strip()), bound)
    return found


def raised(settings: Mapping[str, str], minima: Mapping[str, int]) -> dict[str, str]:
    """``settings`` with each of ``minima`` at least its value (case-insensitive names)."""
    out = dict(settings)
    lowered = {k.lower(): k for k in out}
    for name, least in minima.items():
        key = lowered.get(name, name)
        current = out.get(key, "")
        if not current.isdigit() or int(current) < least:
            out.pop(key, None)
            out[name] = str(least)
    return out


def standby_settings(
    *,
    endpoint_id: str,
    wal_sockets: Path,
    primary_port: int | None,
    archive: Path | None,
) -> dict[str, str]:
    """What makes the postmaster a hot standby following its branch (see the module's words)."""
    settings = {
        "hot_standby": "on",
        "archive_mode": "off",  # the branch's archive is its primary's to write
        "wal_retrieve_retry_interval": RETRY_INTERVAL,
        "primary_slot_name": "",
        "recovery_target_timeline": "latest",
        "primary_conninfo": "",
        "restore_command": "",
    }
    if primary_port is not None:
        parts = {
            "host": str(wal_sockets),
            "port": str(primary_port),
            "user": ADMIN_USER,
            "application_name": endpoint_id,
            "connect_timeout": "5",
            "sslmode": "disable",
        }
        settings["primary_conninfo"] = " ".join(f"{k}={_quote(v)}" for k, v in parts.items())
    if archive is not None:
        # %p is relative to the data directory (pg_wal/RECOVERYXLOG); %f a segment's name.
        settings["restore_command"] = f"cp {shlex.quote(str(archive))}/%f %p"
    return settings


def _quote(value: str) -> str:
    """A libpq connection-string value, quoted."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
