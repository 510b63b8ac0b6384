"""The new cluster of a schema-only branch: the source's roles and databases, a restoring role,
and what is left to set once each database's schema is in.

The roles are made by the platform (``cloud_admin``, in platform sessions) from what was read,
with only the attributes a tenant's role can have, their verifiers as they were (so the same
passwords log in). The schemas are replayed by a role of the platform's making that exists only
for the build, ``pgplane_restore_<random>``: no superuser, CREATEROLE and CREATEDB as the
tenant's roles have, and a member of each of them (ADMIN, INHERIT, SET). It is what the tenant
holds, and no more: whatever a hostile schema makes Postgres run during the restore runs as it.

``pg_dump``'s output assumes a superuser replays it in one respect: ``ALTER … OWNER TO r``
requires ``r`` to hold CREATE on the object's schema (and on the database, for a schema), while
the schemas' own privileges only come at the end of the dump. So during the build every role of
the project holds CREATE on each database and each schema (a default privilege of the restoring
role for the schemas it creates); afterwards those grants are taken back wherever the source had
none, the database's privileges are set to the source's, and the restoring role is dropped with
what it still owns (an extension it created) given to the database's owner.

Settings (``ALTER ROLE/DATABASE … SET``) are applied last, by the restoring role: what the tenant
set is set as the tenant could (no superuser-only parameter), and none of it is in force while
the schemas are replayed.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import psycopg
from psycopg import sql

from pgplane.compute.driver import ComputeError, RestoreFailed
from pgplane.compute.local.postgres.sessions import Conn, admin_conninfo, connect
from pgplane.compute.local.schemaonly.source import (
    SCHEMA_CREATES,
    DatabaseDef,
    Membership,
    RoleDef,
    SchemaSource,
    Setting,
)

# Parameters whose value is a list Postgres stores quoted element by element: set as a list
# (what pg_dump's makeAlterConfigCommand does), or they would be stored as one quoted element.
_LIST_QUOTED = frozenset(
    {
        "local_preload_libraries",
        "search_path",
        "session_preload_libraries",
        "shared_preload_libraries",
        "temp_tablespaces",
        "unix_socket_directories",
    }
)
# aclexplode's names of a database's privileges, as GRANT spells them (only these are granted).
_DATABASE_PRIVILEGES = {p: sql.SQL(p) for p in ("CREATE", "CONNECT", "TEMPORARY")}
_MEMBERSHIP_ROUNDS = 20  # a grant by a role needs that role's ADMIN granted first


def restorer_name(source: SchemaSource) -> str:
    taken = {r.name for r in source.roles}
    while True:
        name = f"pgplane_restore_{secrets.token_hex(6)}"
        if name not in taken:
            return name


async def prepare(socket_dir: Path, port: int, source: SchemaSource, restorer: str) -> None:
    """Roles, memberships, databases, and the CREATE privileges the replay needs."""
    tenant = [sql.Identifier(r.name) for r in source.roles]
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        create = sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE")
        await _run(conn, "creating the restoring role", create.format(sql.Identifier(restorer)))
        for role in source.roles:
            await _run(conn, f"creating role {role.name!r}", _create_role(role))
        await _grant_memberships(conn, source.memberships, conn.info.server_version)
        if tenant:
            options = (
                "WITH ADMIN TRUE, INHERIT TRUE, SET TRUE"
                if conn.info.server_version >= 160000
                else "WITH ADMIN OPTION"
            )
            grant = sql.SQL("GRANT {} TO {} " + options).format(
                sql.SQL(", ").join(tenant), sql.Identifier(restorer)
            )
            await _run(conn, "giving the restoring role the project's roles", grant)
        for db in source.databases:
            await _run(conn, f"creating database {db.name!r}", _create_database(db))
            if tenant:
                grant = sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                    sql.Identifier(db.name), sql.SQL(", ").join(tenant)
                )
                await _run(conn, f"preparing database {db.name!r}", grant)
    for db in source.databases:
        async with await connect(admin_conninfo(socket_dir, port, db.name)) as conn:
            if not tenant:
                continue
            roles, me = sql.SQL(", ").join(tenant), sql.Identifier(restorer)
            for statement in (
                sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(roles),
                sql.SQL("SET ROLE {}").format(me),
                sql.SQL(
                    "ALTER DEFAULT PRIVILEGES FOR ROLE {} GRANT CREATE ON SCHEMAS TO {}"
                ).format(me, roles),
            ):
                await _run(conn, f"preparing database {db.name!r}", statement)


async def finish(socket_dir: Path, port: int, source: SchemaSource, restorer: str) -> None:
    """Settings, the databases' comments and privileges, the temporary grants taken back, and
    the restoring role gone."""
    names = {r.name for r in source.roles}
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        me = sql.Identifier(restorer)
        await _run(conn, "becoming the restoring role", sql.SQL("SET ROLE {}").format(me))
        for setting in source.settings:
            await _run(conn, f"applying the setting {setting.name!r}", _alter_set(setting))
        for db in source.databases:
            if db.comment is not None:
                comment = sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(db.name), sql.Literal(db.comment)
                )
                await _run(conn, f"commenting database {db.name!r}", comment)
        await conn.execute("RESET ROLE")
        for db in source.databases:
            await _database_privileges(conn, db, names)
    for db in source.databases:
        async with await connect(admin_conninfo(socket_dir, port, db.name)) as conn:
            await _schema_privileges(conn, db, names)
            what = f"giving what the restore made in {db.name!r} to its owner"
            reassign = sql.SQL("REASSIGN OWNED BY {} TO {}").format(me, sql.Identifier(db.owner))
            await _run(conn, what, reassign)
            await _run(conn, what, sql.SQL("DROP OWNED BY {}").format(me))
    async with await connect(admin_conninfo(socket_dir, port)) as conn:
        await _run(conn, "dropping the restoring role", sql.SQL("DROP OWNED BY {}").format(me))
        await _run(conn, "dropping the restoring role", sql.SQL("DROP ROLE {}").format(me))


def _create_role(role: RoleDef) -> sql.Composed:
    parts = [
        sql.SQL("CREATE ROLE {}").format(sql.Identifier(role.name)),
        sql.SQL("LOGIN" if role.login else "NOLOGIN"),
        sql.SQL("INHERIT" if role.inherit else "NOINHERIT"),
        sql.SQL("CREATEROLE" if role.createrole else "NOCREATEROLE"),
        sql.SQL("CREATEDB" if role.createdb else "NOCREATEDB"),
        sql.SQL("CONNECTION LIMIT {}").format(sql.Literal(role.connection_limit)),
    ]
    if role.replication:
        parts.append(sql.SQL("REPLICATION"))
    if role.valid_until is not None:
        parts.append(sql.SQL("VALID UNTIL {}").format(sql.Literal(role.valid_until)))
    if role.verifier is not None:
        # A verifier is stored as it is (Postgres recognises one): the same password logs in.
        parts.append(sql.SQL("PASSWORD {}").format(sql.Literal(role.verifier)))
    return sql.SQL(" ").join(parts)


async def _grant_memberships(conn: Conn, memberships: list[Membership], version: int) -> None:
    """Each membership, granted by whom the source says when that is one of the project's roles
    (so the tenant can revoke it as before); in rounds, as a grantor needs its ADMIN first."""
    pending = list(memberships)
    for _ in range(_MEMBERSHIP_ROUNDS):
        failed: list[tuple[Membership, str]] = []
        for m in pending:
            try:
                await conn.execute(_membership(m, version))
            except psycopg.Error as exc:
                failed.append((m, str(exc)))
        if not failed:
            return
        if len(failed) == len(pending):
            m, reason = failed[0]
            raise RestoreFailed(f"granting role {m.role!r} to {m.member!r} failed: {reason}")
        pending = [m for m, _ in failed]
    raise RestoreFailed("the source's role memberships could not all be granted")


def _membership(m: Membership, version: int) -> sql.Composed:
    options: list[str] = []
    if version >= 160000:
        options = [f"ADMIN {bool(m.admin)}", f"INHERIT {bool(m.inherit)}", f"SET {bool(m.set)}"]
    elif m.admin:
        options = ["ADMIN OPTION"]
    statement = sql.SQL("GRANT {} TO {}").format(sql.Identifier(m.role), sql.Identifier(m.member))
    if options:
        statement = sql.SQL("{} WITH {}").format(statement, sql.SQL(", ".join(options)))
    if m.grantor is not None:
        statement = sql.SQL("{} GRANTED BY {}").format(statement, sql.Identifier(m.grantor))
    return statement


def _create_database(db: DatabaseDef) -> sql.Composed:
    parts = [
        sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0 ENCODING {}").format(
            sql.Identifier(db.name), sql.Identifier(db.owner), sql.Literal(db.encoding)
        ),
        sql.SQL("LC_COLLATE {} LC_CTYPE {}").format(sql.Literal(db.collate), sql.Literal(db.ctype)),
        sql.SQL("CONNECTION LIMIT {}").format(sql.Literal(db.connection_limit)),
    ]
    if db.provider == "i":
        parts.append(sql.SQL("LOCALE_PROVIDER icu ICU_LOCALE {}").format(sql.Literal(db.locale)))
        if db.icu_rules is not None:
            parts.append(sql.SQL("ICU_RULES {}").format(sql.Literal(db.icu_rules)))
    elif db.provider == "b":
        parts.append(
            sql.SQL("LOCALE_PROVIDER builtin BUILTIN_LOCALE {}").format(sql.Literal(db.locale))
        )
    return sql.SQL(" ").join(parts)


def _alter_set(s: Setting) -> sql.Composed:
    values = _split_list(s.value) if s.name.lower() in _LIST_QUOTED else [s.value]
    value = sql.SQL(", ").join(sql.Literal(v) for v in values)
    if s.role is None:
        target = sql.SQL("ALTER DATABASE {}").format(sql.Identifier(s.database or ""))
    else:
        target = sql.SQL("ALTER ROLE {}").format(sql.Identifier(s.role))
        if s.database is not None:
            target = sql.SQL("{} IN DATABASE {}").format(target, sql.Identifier(s.database))
    return sql.SQL("{} SET {} TO {}").format(target, sql.Identifier(s.name), value)


def _split_list(value: str) -> list[str]:
    """A stored list value (``a, "b c"``) into its elements, as Postgres' SplitGUCList."""
    items: list[str] = []
    i, n = 0, len(value)
    while i < n:
        while i < n and value[i].isspace():
            i += 1
        if i < n and value[i] == '"':
            j, item = i + 1, []
            while j < n:
                if value[j] == '"':
                    if j + 1 < n and value[j + 1] == '"':
                        item.append('"')
                        j += 2
                        continue
                    break
                item.append(value[j])
                j += 1
            items.append("".join(item))
            i = value.find(",", j)
        else:
            end = value.find(",", i)
            items.append(value[i : n if end < 0 else end].strip())
            i = end
        if i < 0:
            break
        i += 1
    return items


async def _database_privileges(conn: Conn, db: DatabaseDef, names: set[str]) -> None:
    """The database's privileges as the source's: the build's CREATE grants taken back, or,
    where the source had privileges of its own, those exactly (each by its grantor)."""
    name = sql.Identifier(db.name)
    others = [sql.Identifier(n) for n in sorted(names) if n != db.owner]
    if db.acl is None:
        if others:
            revoke = sql.SQL("REVOKE CREATE ON DATABASE {} FROM {}").format(
                name, sql.SQL(", ").join(others)
            )
            await _run(conn, f"setting the privileges of {db.name!r}", revoke)
        return
    everyone = sql.SQL(", ").join([sql.SQL("PUBLIC"), *(sql.Identifier(n) for n in sorted(names))])
    await _run(
        conn,
        f"setting the privileges of {db.name!r}",
        sql.SQL("REVOKE ALL ON DATABASE {} FROM {}").format(name, everyone),
    )
    for grant in sorted(db.acl, key=lambda g: g.grantor != db.owner):
        if grant.privilege not in _DATABASE_PRIVILEGES:
            continue
        statement = sql.SQL("GRANT {} ON DATABASE {} TO {}{}").format(
            _DATABASE_PRIVILEGES[grant.privilege],
            name,
            sql.SQL("PUBLIC") if grant.grantee is None else sql.Identifier(grant.grantee),
            sql.SQL(" WITH GRANT OPTION" if grant.grantable else ""),
        )
        # As its grantor, so the tenant's grant chain stays its own.
        await _run(conn, "granting", sql.SQL("SET ROLE {}").format(sql.Identifier(grant.grantor)))
        try:
            await _run(conn, f"granting on database {db.name!r}", statement)
        finally:
            await conn.execute("RESET ROLE")


async def _schema_privileges(conn: Conn, db: DatabaseDef, names: set[str]) -> None:
    """The build's CREATE grants on schemas taken back where the source had none."""
    rows = await (await conn.execute(SCHEMA_CREATES)).fetchall()
    extra = {
        (str(schema), str(grantee))
        for schema, grantee, grantor in rows
        if grantee in names and (schema, grantee, grantor) not in db.schema_creates
    }
    for schema, grantee in sorted(extra):
        # As superuser, performed as the schema's owner: it takes back the owner's grant.
        revoke = sql.SQL("REVOKE CREATE ON SCHEMA {} FROM {}").format(
            sql.Identifier(schema), sql.Identifier(grantee)
        )
        await _run(conn, f"setting the privileges of schema {schema!r}", revoke)


async def _run(conn: Conn, what: str, statement: sql.Composed | sql.SQL) -> None:
    try:
        await conn.execute(statement)
    except psycopg.OperationalError as exc:  # the connection, not the statement: retried
        raise ComputeError(f"{what} failed: {exc}") from exc
    except psycopg.Error as exc:
        raise RestoreFailed(f"{what} failed: {exc}") from exc
