"""Platform sessions on a compute: the one way the platform opens a SQL session on a cluster.

A compute's databases belong to a tenant, who may do anything a non-superuser may: create objects
in ``public`` (or any schema it owns), ``ALTER DATABASE``/``ALTER ROLE … SET`` defaults, and
choose the endpoint's ``pg_settings``. The platform's own sessions run in those same databases,
some as superuser. So every platform session follows these rules (DESIGN §6):

1. **Pinned at connection time.** Its settings travel in the startup packet's ``options``
   (:data:`PINNED`). Postgres applies them with source PGC_S_CLIENT, which outranks every
   default a tenant can set: ``postgresql.conf``, ``ALTER SYSTEM`` and the postmaster's command
   line (endpoint ``pg_settings``), ``ALTER DATABASE … SET``, ``ALTER ROLE … SET`` and their
   per-database form. They are in force before the first statement, so there is no moment in
   which a tenant default holds (a ``SET`` after connecting would leave one, and would itself be
   resolved under the tenant's ``search_path``). The few settings only newer majors know are set
   right after connecting (:func:`connect`), through a qualified ``pg_catalog.set_config``.
2. **Every name schema-qualified.** ``pg_catalog.pg_roles``, ``pg_catalog.pg_terminate_backend``,
   ``OPERATOR(pg_catalog.=)`` wherever an operator could be shadowed, casts to
   ``pg_catalog.`` types. ``search_path=pg_catalog, pg_temp`` already keeps tenant schemas out;
   qualifying is the second wall, should a statement ever run where the pin does not hold.
3. **Superuser only where the work needs it.** ``cloud_admin`` (:data:`ADMIN_USER`) creates and
   drops roles and databases and takes online backups; checks that only read (availability,
   activity) log in as :data:`MONITOR_USER`, a member of ``pg_monitor`` and nothing more
   (:mod:`pgplane.compute.local.postgres.monitor`).
4. **Nothing a tenant chose becomes SQL text** but through ``psycopg.sql`` (Identifier, Literal)
   or query parameters.

Both roles log in over the compute's unix socket (``local all all trust``): its directory is 0700
and owned by the compute's OS user, so only the platform and that OS user reach it.
"""

from __future__ import annotations

import os
import pwd
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

if TYPE_CHECKING:
    from pgplane.compute.model import RoleSpec

ADMIN_USER = "cloud_admin"
MONITOR_USER = "pgplane_monitor"
# Roles the platform keeps for itself on every compute: the API refuses them as role names.
PLATFORM_ROLES = frozenset({ADMIN_USER, MONITOR_USER})

Conn = psycopg.AsyncConnection[tuple[Any, ...]]

# What a platform session pins, and why each: a tenant default that could change what our
# statements mean, whether they run, or what they leave behind.
PINNED: tuple[tuple[str, str], ...] = (
    # Names resolve in pg_catalog first, then our own temporary schema, never a tenant's schema
    # (``public`` holds tenant views and functions that shadow catalog names). pg_temp is named
    # last so that not even temporary objects can shadow (as the docs advise SECURITY DEFINER).
    ("search_path", "pg_catalog, pg_temp"),
    # ``ALTER DATABASE … SET role = tenant_role`` would run our superuser session as the tenant.
    ("role", "none"),
    # A tenant's tiny timeouts would fail our work; ours are set per session (statement_timeout,
    # see conninfo) and bound lock waits too. Idle timeouts would end a session between our
    # statements (the online backup's session idles through the whole file copy).
    ("lock_timeout", "0"),
    ("idle_in_transaction_session_timeout", "0"),
    ("idle_session_timeout", "0"),
    # ``default_transaction_read_only = on`` would fail every change; serializable or deferrable
    # defaults would make plain catalog reads fail or wait.
    ("default_transaction_read_only", "off"),
    ("default_transaction_isolation", "read committed"),
    ("default_transaction_deferrable", "off"),
    # What a role change or a new database commits must be durable before we report it done.
    ("synchronous_commit", "on"),
    # Passwords are stored as SCRAM verifiers, whatever the endpoint's settings say.
    ("password_encryption", "scram-sha-256"),
    # Nothing we run creates a relation or spills to disk, but a tenant's tablespace choice must
    # not be able to make one of our statements fail.
    ("default_tablespace", ""),
    ("temp_tablespaces", ""),
    # Any user may set local_preload_libraries (from $libdir/plugins): not in our sessions.
    ("local_preload_libraries", ""),
    # How values travel: names may be any UTF-8, psycopg parses dates and literals as it expects.
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    # sql.Literal quotes for standard strings (the password literal is the one we build).
    ("standard_conforming_strings", "on"),
    # A tenant's debug level would flood our sessions with notices.
    ("client_min_messages", "warning"),
)
# Settings only newer majors know: an unknown name in the startup packet fails the login, so
# these are set just after connecting, by server version (see connect).
_PINNED_FROM_VERSION: tuple[tuple[int, str, str], ...] = (
    # A verifier with a tenant's huge iteration count would stall our ALTER ROLE (and every
    # later login through the proxy): the default 4096, as before the setting existed.
    (160000, "scram_iterations", "4096"),
    # Ends a whole transaction however it is split into statements; ours are bounded already.
    (170000, "transaction_timeout", "0"),
)

SESSION_TIMEOUT = 120.0  # seconds; the platform's default bound on one session's statements


def options(statement_timeout: float) -> str:
    """The startup packet's ``options``: ``-c name=value`` for each pinned setting."""
    pinned = [*PINNED, ("statement_timeout", str(max(1, round(statement_timeout * 1000))))]
    return " ".join(f"-c {name}={_escape(value)}" for name, value in pinned)


def _escape(value: str) -> str:
    # Postgres splits options on whitespace; a backslash keeps the next character literal.
    return "".join(f"\\{c}" if c.isspace() or c == "\\" else c for c in value)


def conninfo(
    socket_dir: Path,
    port: int,
    *,
    user: str = ADMIN_USER,
    dbname: str = "postgres",
    statement_timeout: float = SESSION_TIMEOUT,
) -> str:
    """A pinned session over the unix socket; explicit so PG* variables cannot interfere.

    ``requirepeer``: libpq checks who listens on the socket before it sends a byte. The socket
    directory is the project's user's, made by the platform in a directory of root's; the
    socket in it is whatever that user put there, a link to another account's compute
    included. Only a postmaster running as the directory's owner is spoken to.
    """
    return make_conninfo(
        host=str(socket_dir),
        requirepeer=_owner(socket_dir),
        port=port,
        user=user,
        dbname=dbname,
        sslmode="disable",
        gssencmode="disable",
        connect_timeout=5,
        application_name="pgplane",
        options=options(statement_timeout),
    )


def _owner(directory: Path) -> str:
    try:
        return pwd.getpwuid(os.stat(directory).st_uid).pw_name
    except (OSError, KeyError):
        # No such directory (nothing listens there) or a user without a name: connect to no one.
        return "\u2205nobody"


def admin_conninfo(socket_dir: Path, port: int, dbname: str = "postgres") -> str:
    """cloud_admin, pinned: only for work that needs a superuser."""
    return conninfo(socket_dir, port, user=ADMIN_USER, dbname=dbname)


async def connect(info: str) -> Conn:
    """Open a pinned session (autocommit); the settings only this server's major knows too."""
    conn: Conn = await psycopg.AsyncConnection.connect(info, autocommit=True)
    try:
        version = conn.info.server_version
        later = [(n, v) for since, n, v in _PINNED_FROM_VERSION if version >= since]
        if later:
            calls = sql.SQL(", ").join(
                sql.SQL("pg_catalog.set_config({}, {}, false)").format(
                    sql.Literal(name), sql.Literal(value)
                )
                for name, value in later
            )
            await conn.execute(sql.SQL("SELECT {}").format(calls))
    except BaseException:
        await conn.close()
        raise
    return conn


def role_password(password: str) -> sql.Composable:
    """A role's PASSWORD clause value: the password quoted, or NULL for none (a role that
    cannot log in has none)."""
    return sql.Literal(password) if password else sql.SQL("NULL")


def role_attributes(role: RoleSpec) -> sql.Composable:
    """LOGIN or NOLOGIN, and REPLICATION when the role may replicate. REPLICATION is only ever
    given: logical replication cannot be turned off, and a role a tenant made is its own."""
    words = ["LOGIN" if role.login else "NOLOGIN"]
    if role.replication:
        words.append("REPLICATION")
    return sql.SQL(" ".join(words))
