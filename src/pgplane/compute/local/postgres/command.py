"""A postmaster's command line: the settings an endpoint may give it, checked by Postgres itself,
and the options the platform puts last so that none of them can override routing or security."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from pgplane.compute.driver import InvalidSettings
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.tenants.user import C_LOCALE, RunAs

# Settings pgplane owns: routing, the socket, where the configuration and data live.
_MANAGED = frozenset(
    {
        "port",
        "listen_addresses",
        "unix_socket_directories",
        "unix_socket_permissions",
        "unix_socket_group",
        "logging_collector",
        "data_directory",
        "config_file",
        "hba_file",
        "ident_file",
        "ssl",
        "ssl_cert_file",
        "ssl_key_file",
        # The project's (enable_logical_replication): logical slots need it kept.
        "wal_level",
    }
)
_SETTING_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def check_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """Validate endpoint settings before they reach the command line."""
    for name, value in settings.items():
        if _SETTING_NAME.fullmatch(name) is None:
            raise InvalidSettings(f"invalid Postgres setting name {name!r}")
        # pgplane.*: the platform's own library's (the size limit), set in its files only.
        if name.lower() in _MANAGED or name.lower().startswith("pgplane."):
            raise InvalidSettings(f"Postgres setting {name!r} is managed by pgplane")
        if not isinstance(value, str) or "\0" in value:
            raise InvalidSettings(f"invalid value for Postgres setting {name!r}")
    return dict(settings)


# Postgres' own words in what it prints to stderr before exiting: "FATAL:  invalid value ...".
_FATAL = re.compile(r"FATAL:\s+(.+)")
_CHECK_TIME_LIMIT = 30.0


async def validate_settings(
    install: PgInstall, run_as: RunAs, config_dir: Path, settings: Mapping[str, str]
) -> None:
    """Ask Postgres itself whether it takes these values, as the postmaster would read them.

    ``postgres -C`` parses every ``-c`` (type, unit, range, enum choices, time zones) and prints
    one setting without touching any data; a value it refuses makes it exit with the reason. A
    value it takes can still stop a postmaster from starting (shared memory the machine cannot
    give): that shows as the start's failure. ``config_dir`` holds a postgresql.conf to read.
    """
    checked = check_settings(settings)
    if not checked:
        return
    # -C first: the one form Postgres allows as root (it only reads configuration).
    argv: list[str | os.PathLike[str]] = [install.postgres, "-C", "server_version_num"]
    argv += ["-D", config_dir]
    for name, value in checked.items():
        argv += ["-c", f"{name}={value}"]
    done = await run_as.completed(argv, time_limit=_CHECK_TIME_LIMIT, env=C_LOCALE)
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace")
        found = _FATAL.search(err)
        raise InvalidSettings(
            found.group(1).strip() if found else f"postgres refused the settings: {err[-500:]}"
        )


def postmaster_argv(
    install: PgInstall,
    pgdata: Path,
    *,
    port: int,
    socket_dir: Path,
    listen: str,
    settings: Mapping[str, str],
    hba_file: Path,
    more_socket_dirs: Sequence[Path] = (),
    wal_level: str | None = "logical",
) -> list[str]:
    """The command line; what routing and security depend on comes last, so no setting can
    override it (``hba_file`` too: see :mod:`pgplane.compute.local.postgres.hba`).

    ``more_socket_dirs``: where else the postmaster puts a socket (a read-write compute's for
    its replicas, :mod:`..replicas`); ``socket_dir`` stays the first, where it is reached.
    ``wal_level``: a compute's is its project's (None: Postgres' default, ``replica``); the
    platform's own postmasters (roles applied offline, replays, reads of the past) take
    ``logical``, which starts on any data, whereas a logical replication slot makes Postgres
    refuse to start below it."""
    argv = [str(install.postgres), "-D", str(pgdata)]
    for name, value in settings.items():
        argv += ["-c", f"{name}={value}"]
    # Postgres splits the list at commas: a directory whose path has one is left out.
    dirs = [str(socket_dir), *(str(d) for d in more_socket_dirs if "," not in str(d))]
    # On the command line, not in postgresql.conf: ALTER SYSTEM cannot break them (as patroni).
    argv += ["-p", str(port), "-k", ",".join(dirs), "-c", f"listen_addresses={listen}"]
    argv += ["-c", "unix_socket_permissions=0700", "-c", "logging_collector=off"]
    # A compute started before hba_file was passed differs from this command line, so _serves
    # restarts it once, at its next start or apply_config, and it follows the platform's rule.
    argv += ["-c", f"hba_file={hba_file}"]
    if wal_level is not None:
        argv += ["-c", f"wal_level={wal_level}"]
    return argv
