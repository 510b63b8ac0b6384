"""What a schema-only branch takes from its source: roles, databases, and each one's schema.

Read on whichever postmaster serves the source (its running compute, a temporary one on a
suspended branch's data, or one on the data rebuilt at a point: see ``SchemaOnly``), in one
visit. The catalog is read in platform sessions (pinned, every name qualified: ``sessions``);
each database's schema is ``pg_dump --schema-only`` as ``dump_schema`` runs it (as the project's
user, sandboxed, bounded, the platform's roles left out).

Everything read is the tenant's, and a tenant holding its compute's OS user answers with what it
likes: names and values only ever reach the new cluster through ``psycopg.sql`` (Identifier,
Literal), and the dumps are restored as the tenant's own roles (``restore``). The platform's own
roles are not copied. A role the tenant could not have made (a superuser, say) or a membership
only a superuser grants stops the build with a reason: copied, it would hand the new branch what
the tenant was never given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from pgplane.compute.driver import ComputeError, RestoreFailed
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.schema_dump import dump_schema
from pgplane.compute.local.postgres.sessions import PLATFORM_ROLES, admin_conninfo, connect
from pgplane.compute.local.postgres.verifiers import MAX_VERIFIER_BYTES
from pgplane.compute.local.tenants.user import RunAs
from pgplane.compute.local.tenants.walls import Walls

MAX_ROLES = 10_000
MAX_DATABASES = 500
# Databases the platform keeps (every cluster has them): never copied, never restored into.
SKIPPED_DATABASES = ("postgres", "template0", "template1")


@dataclass(frozen=True, slots=True)
class RoleDef:
    name: str
    verifier: str | None  # SCRAM (or whatever the source stored), None: no password
    login: bool
    inherit: bool
    createrole: bool
    createdb: bool
    connection_limit: int
    valid_until: str | None
    # Given by the platform where logical replication is on (the branch's project's).
    replication: bool = False


@dataclass(frozen=True, slots=True)
class Membership:
    role: str
    member: str
    grantor: str | None  # None: granted by the platform (the bootstrap superuser)
    admin: bool
    inherit: bool | None  # None: a major without the option (before 16)
    set: bool | None


@dataclass(frozen=True, slots=True)
class Setting:
    """One ``ALTER ROLE … [IN DATABASE …] SET`` (``role`` None: ``ALTER DATABASE … SET``)."""

    role: str | None
    database: str | None
    name: str
    value: str


@dataclass(frozen=True, slots=True)
class Grant:
    grantor: str
    grantee: str | None  # None: PUBLIC
    privilege: str
    grantable: bool


@dataclass(slots=True)
class DatabaseDef:
    name: str
    owner: str
    encoding: str
    collate: str
    ctype: str
    provider: str | None  # c (libc), i (icu), b (builtin); None before 15
    locale: str | None  # the icu or builtin locale
    icu_rules: str | None
    connection_limit: int
    comment: str | None
    acl: list[Grant] | None  # None: the default privileges
    # (schema, grantee, grantor) of every CREATE privilege on its schemas.
    schema_creates: set[tuple[str, str, str]] = field(default_factory=set)
    sql: str = ""


@dataclass(slots=True)
class SchemaSource:
    roles: list[RoleDef] = field(default_factory=list)
    memberships: list[Membership] = field(default_factory=list)
    settings: list[Setting] = field(default_factory=list)
    databases: list[DatabaseDef] = field(default_factory=list)

    def verifiers(self) -> dict[str, str]:
        """The SCRAM verifiers of the login roles, as the proxy authenticates them."""
        return {
            r.name: r.verifier
            for r in self.roles
            if r.login and r.verifier and r.verifier.startswith("SCRAM-SHA-256$")
        }


# A verifier past the proxy's bound (verifiers.py) is not copied: the role comes without one.
_ROLES = (
    "SELECT a.rolname, CASE WHEN pg_catalog.octet_length(a.rolpassword)"
    " OPERATOR(pg_catalog.<=) %s THEN a.rolpassword END, a.rolcanlogin, a.rolinherit,"
    " a.rolcreaterole,"
    " a.rolcreatedb, a.rolconnlimit, a.rolvaliduntil::pg_catalog.text, a.rolsuper,"
    " a.rolreplication, a.rolbypassrls FROM pg_catalog.pg_authid AS a"
    " WHERE a.oid OPERATOR(pg_catalog.>=) 16384"  # FirstNormalObjectId: not Postgres' own
    " AND NOT pg_catalog.starts_with(a.rolname, 'pg_')"
    " AND NOT (a.rolname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[]))"
    " ORDER BY a.rolname LIMIT %s"
)
_MEMBERSHIPS = (
    "SELECT r.rolname, m.rolname, g.rolname, am.admin_option,"
    " (pg_catalog.to_jsonb(am) OPERATOR(pg_catalog.->>) 'inherit_option')::pg_catalog.bool,"
    " (pg_catalog.to_jsonb(am) OPERATOR(pg_catalog.->>) 'set_option')::pg_catalog.bool"
    " FROM pg_catalog.pg_auth_members AS am"
    " JOIN pg_catalog.pg_authid AS r ON r.oid OPERATOR(pg_catalog.=) am.roleid"
    " JOIN pg_catalog.pg_authid AS m ON m.oid OPERATOR(pg_catalog.=) am.member"
    " LEFT JOIN pg_catalog.pg_authid AS g ON g.oid OPERATOR(pg_catalog.=) am.grantor"
)
_SETTINGS = (
    "SELECT d.datname, r.rolname, s.setrole OPERATOR(pg_catalog.=) 0, s.setconfig"
    " FROM pg_catalog.pg_db_role_setting AS s"
    " LEFT JOIN pg_catalog.pg_database AS d ON d.oid OPERATOR(pg_catalog.=) s.setdatabase"
    " LEFT JOIN pg_catalog.pg_authid AS r ON r.oid OPERATOR(pg_catalog.=) s.setrole"
)
_DATABASES = (
    "SELECT d.datname, pg_catalog.pg_get_userbyid(d.datdba),"
    " pg_catalog.pg_encoding_to_char(d.encoding), d.datcollate, d.datctype,"
    " pg_catalog.to_jsonb(d) OPERATOR(pg_catalog.->>) 'datlocprovider',"
    " COALESCE(pg_catalog.to_jsonb(d) OPERATOR(pg_catalog.->>) 'datlocale',"
    "  pg_catalog.to_jsonb(d) OPERATOR(pg_catalog.->>) 'daticulocale'),"
    " pg_catalog.to_jsonb(d) OPERATOR(pg_catalog.->>) 'daticurules',"
    " d.datconnlimit, pg_catalog.shobj_description(d.oid, 'pg_database'),"
    " d.datacl IS NULL, d.datallowconn"
    " FROM pg_catalog.pg_database AS d WHERE NOT d.datistemplate"
    " AND NOT (d.datname OPERATOR(pg_catalog.=) ANY (%s::pg_catalog.name[]))"
    " ORDER BY d.datname LIMIT %s"
)
_DATABASE_ACL = (
    "SELECT d.datname, pg_catalog.pg_get_userbyid(a.grantor),"
    " CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN NULL"
    " ELSE pg_catalog.pg_get_userbyid(a.grantee) END, a.privilege_type, a.is_grantable"
    " FROM pg_catalog.pg_database AS d, LATERAL pg_catalog.aclexplode(d.datacl) AS a"
)
# The CREATE privileges on a database's schemas (what ownership needs while restoring).
SCHEMA_CREATES = (
    "SELECT n.nspname, pg_catalog.pg_get_userbyid(a.grantee),"
    " pg_catalog.pg_get_userbyid(a.grantor) FROM pg_catalog.pg_namespace AS n,"
    " LATERAL pg_catalog.aclexplode(COALESCE(n.nspacl,"
    "  pg_catalog.acldefault('n', n.nspowner))) AS a"
    " WHERE a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'"
)


class SourceReader:
    """The action (``Computes.on_branch``, ``PointReads.run``) that reads the source once;
    ``source`` holds what it read."""

    def __init__(self, install: PgInstall, run_as: RunAs, walls: Walls, max_bytes: int) -> None:
        self._install, self._run_as, self._walls = install, run_as, walls
        self._max_bytes = max_bytes
        self.source = SchemaSource()

    async def __call__(self, socket_dir: Path, port: int) -> None:
        try:
            source = await _catalog(socket_dir, port)
            left = self._max_bytes
            for db in source.databases:
                async with await connect(admin_conninfo(socket_dir, port, db.name)) as conn:
                    rows = await (await conn.execute(SCHEMA_CREATES)).fetchall()
                db.schema_creates = {(str(s), str(e), str(g)) for s, e, g in rows}
                db.sql = await dump_schema(
                    self._install,
                    self._run_as,
                    socket_dir,
                    port,
                    db.name,
                    max_bytes=left,
                    walls=self._walls,
                )
                left -= len(db.sql.encode())
        except psycopg.Error as exc:
            raise ComputeError(f"reading the source branch's catalog: {exc}") from exc
        self.source = source


async def _catalog(socket_dir: Path, port: int) -> SchemaSource:
    platform = sorted(PLATFORM_ROLES)
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        roles = await _all(conn, _ROLES, (MAX_VERIFIER_BYTES, platform, MAX_ROLES + 1))
        memberships = await _all(conn, _MEMBERSHIPS, ())
        settings = await _all(conn, _SETTINGS, ())
        databases = await _all(conn, _DATABASES, (list(SKIPPED_DATABASES), MAX_DATABASES + 1))
        acl = await _all(conn, _DATABASE_ACL, ())
    if len(roles) > MAX_ROLES or len(databases) > MAX_DATABASES:
        raise RestoreFailed(
            f"the source has more than {MAX_ROLES} roles or {MAX_DATABASES} databases"
        )
    source = SchemaSource(roles=[_role(r) for r in roles])
    names = {r.name for r in source.roles}
    source.memberships = _memberships(memberships, names)
    for row in databases:
        source.databases.append(_database(row, names))
    by_name = {d.name: d for d in source.databases}
    for datname, grantor, grantee, privilege, grantable in acl:
        db = by_name.get(datname)
        known = grantor in names and (grantee is None or grantee in names)
        if db is not None and db.acl is not None and known:
            db.acl.append(Grant(str(grantor), grantee, str(privilege), bool(grantable)))
    source.settings = _settings(settings, names, set(by_name))
    return source


async def _all(conn: Any, query: Any, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    cur = await conn.execute(query, params or None)
    return list(await cur.fetchall())


def _role(row: tuple[Any, ...]) -> RoleDef:
    name, password, login, inherit, createrole, createdb, limit, until, sup, repl, bypass = row
    if sup or bypass:
        raise RestoreFailed(
            f"role {name!r} is a superuser or has BYPASSRLS, which no role of a tenant holds:"
            " it is not copied into a schema-only branch"
        )
    return RoleDef(
        name=str(name),
        verifier=None if password is None else str(password),
        login=bool(login),
        inherit=bool(inherit),
        createrole=bool(createrole),
        createdb=bool(createdb),
        connection_limit=int(limit),
        valid_until=None if until is None else str(until),
        replication=bool(repl),
    )


def _memberships(rows: list[tuple[Any, ...]], names: set[str]) -> list[Membership]:
    found: list[Membership] = []
    for role, member, grantor, admin, inherit, set_ in rows:
        if member not in names:
            continue  # the platform's own (its monitor in pg_monitor, say)
        if role not in names:
            raise RestoreFailed(
                f"role {member!r} is a member of {role!r}, which only the platform grants: it"
                " is not copied into a schema-only branch"
            )
        found.append(
            Membership(
                role=str(role),
                member=str(member),
                grantor=str(grantor) if grantor in names else None,
                admin=bool(admin),
                inherit=inherit,
                set=set_,
            )
        )
    return found


def _database(row: tuple[Any, ...], names: set[str]) -> DatabaseDef:
    name, owner, encoding, collate, ctype, provider, locale, rules, limit, comment, *rest = row
    default_acl, allows_connections = rest
    if owner not in names:
        raise RestoreFailed(f"database {name!r} belongs to {owner!r}, not to a role of the project")
    if not allows_connections:
        raise RestoreFailed(f"database {name!r} does not allow connections: its schema is unread")
    return DatabaseDef(
        name=str(name),
        owner=str(owner),
        encoding=str(encoding),
        collate=str(collate),
        ctype=str(ctype),
        provider=provider,
        locale=locale,
        icu_rules=rules,
        connection_limit=int(limit),
        comment=comment,
        acl=None if default_acl else [],
    )


def _settings(rows: list[tuple[Any, ...]], names: set[str], databases: set[str]) -> list[Setting]:
    found: list[Setting] = []
    for datname, rolname, whole_database, config in rows:
        if datname is not None and datname not in databases:
            continue
        if not whole_database and rolname not in names:
            continue  # a platform role's, or a database's the copy does not hold
        for item in config or []:
            setting_name, _, value = str(item).partition("=")
            found.append(
                Setting(
                    role=None if whole_database else str(rolname),
                    database=datname,
                    name=setting_name,
                    value=value,
                )
            )
    return found
