"""Static masking of an anonymized branch, in SQL the platform writes (core/masking.py reads
the rules' expressions; nothing of them is sent to Postgres as it was written).

Each masked table is rewritten with one ``UPDATE`` per database, in one transaction per
database, so a database's masks apply whole or not at all. The tenant's code must not run with
the platform's rights, nor undo a mask, so the ``UPDATE`` runs:

- as the table's owner (``SET ROLE``): a generated column, an index expression or a check that
  calls the tenant's functions runs them as the tenant, never as the superuser;
- with ``session_replication_role = replica``: the tenant's ordinary triggers and rules (which
  could rewrite the new values, or the statement) do not fire; a table with a trigger or rule
  that fires even then (``ENABLE ALWAYS`` or ``REPLICA``) is refused, by name;
- with ``row_security = off``: a policy that would hide rows from the owner makes Postgres
  refuse the statement rather than leave those rows unmasked;
- with ``search_path`` pinned to ``pg_catalog``: every function the masks call is Postgres'
  own, schema-qualified, so none of the tenant's can stand in for it.

Masked tables are vacuumed afterwards, so the old row versions go from the tables. (Their WAL,
and the branch's history before the masking, still hold the old values: nothing serves them,
see services/anonymized.py.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg
from psycopg import sql

from pgplane import failpoints
from pgplane.compute.local.postgres.sessions import admin_conninfo, connect
from pgplane.compute.model import ColumnMask, ComputeError, MaskingFailed
from pgplane.core.masking import Call, Column, Const, Expr, parse


def _words(text: str) -> list[str]:
    return text.split()


# What the fake names are drawn from (the extension draws from datasets of its own).
_FIRST = _words(
    "alex sam robin jordan taylor casey morgan jamie avery riley quinn drew kai noa "
    "eli mika sasha ari lee max"
)
_LAST = _words(
    "smith garcia kim muller rossi silva novak tanaka dubois jensen kowalski nguyen "
    "okafor larsen haddad moreau ivanova fischer santos berg"
)
_COMPANIES = _words("Acme Globex Initech Umbrella Stark Wayne Hooli Vandelay Wonka Tyrell")
_CITIES = _words(
    "Springfield Riverton Lakeside Fairview Greenville Oakridge Maplewood Brookfield "
    "Ashford Westbury"
)


def _fn(name: str, *args: sql.Composable) -> sql.Composable:
    return sql.SQL("pg_catalog.{}({})").format(sql.SQL(name), sql.SQL(", ").join(args))


def _random_below(n: int) -> sql.Composable:
    return sql.SQL("pg_catalog.floor(pg_catalog.random() * {})::int").format(sql.Literal(n))


def _pick(words: Sequence[str]) -> sql.Composable:
    # Subscripted per row (random() is volatile): one word of the list for each row.
    array = sql.SQL("(ARRAY[{}]::text[])").format(sql.SQL(", ").join(map(sql.Literal, words)))
    return sql.SQL("{}[1 + {}]").format(array, _random_below(len(words)))


def _hex(chars: int) -> sql.Composable:
    return _fn("left", _fn("md5", sql.SQL("pg_catalog.random()::text")), sql.Literal(chars))


def _email() -> sql.Composable:
    return _fn(
        "concat",
        _pick(_FIRST),
        sql.Literal("."),
        _pick(_LAST),
        sql.Literal("."),
        _hex(12),
        sql.Literal("@example.com"),
    )


def _text(e: sql.Composable) -> sql.Composable:
    return sql.SQL("({})::text").format(e)


def render(expr: Expr, column: str) -> sql.Composable:
    """The SQL of a checked expression, ``column`` standing for the rule's column."""
    if isinstance(expr, Column):
        return sql.Identifier(column)
    if isinstance(expr, Const):
        return sql.Literal(expr.value)
    args = [render(a, column) for a in expr.args]
    return _call(expr, args)


_Args = list[sql.Composable]


def _phone(default: str) -> Callable[[_Args], sql.Composable]:
    def phone(args: _Args) -> sql.Composable:
        prefix = _text(args[0]) if args else sql.Literal(default)
        digits = _fn(
            "lpad",
            sql.SQL("({})::text").format(_random_below(10_000_000)),
            sql.Literal(7),
            sql.Literal("0"),
        )
        return _fn("concat", prefix, digits)

    return phone


def _random_string(args: _Args) -> sql.Composable:
    repeated = _fn(
        "repeat",
        _fn("md5", sql.SQL("pg_catalog.random()::text")),
        sql.SQL("(({}) / 32 + 1)::int").format(args[0]),
    )
    return _fn("left", repeated, args[0])


def _random_int_between(args: _Args) -> sql.Composable:
    low, high = args
    return sql.SQL("({} + pg_catalog.floor(pg_catalog.random() * ({} - {} + 1)))::int").format(
        low, high, low
    )


def _partial(args: _Args) -> sql.Composable:
    value, prefix, padding, suffix = args
    return _fn(
        "concat", _fn("left", _text(value), prefix), padding, _fn("right", _text(value), suffix)
    )


def _uuid(_: _Args) -> sql.Composable:
    return sql.SQL("pg_catalog.gen_random_uuid()::text")


_ANON: dict[str, Callable[[_Args], sql.Composable]] = {
    "fake_email": lambda _: _email(),
    "dummy_free_email": lambda _: _email(),
    "dummy_safe_email": lambda _: _email(),
    "fake_first_name": lambda _: _fn("initcap", _pick(_FIRST)),
    "dummy_first_name": lambda _: _fn("initcap", _pick(_FIRST)),
    "fake_last_name": lambda _: _fn("initcap", _pick(_LAST)),
    "dummy_last_name": lambda _: _fn("initcap", _pick(_LAST)),
    "dummy_name": lambda _: _fn(
        "initcap", _fn("concat", _pick(_FIRST), sql.Literal(" "), _pick(_LAST))
    ),
    "fake_company": lambda _: _pick(_COMPANIES),
    "dummy_company_name": lambda _: _pick(_COMPANIES),
    "fake_city": lambda _: _pick(_CITIES),
    "random_phone": _phone("0"),
    "dummy_phone_number": _phone("+1-555-"),
    "random_string": _random_string,
    "random_int_between": _random_int_between,
    "random_zip": lambda _: _fn(
        "lpad",
        sql.SQL("({})::text").format(_random_below(100_000)),
        sql.Literal(5),
        sql.Literal("0"),
    ),
    "dummy_uuidv4": _uuid,
    "partial": _partial,
    "partial_email": lambda a: _fn(
        "regexp_replace",
        _text(a[0]),
        sql.Literal(r"^(.{0,2})[^@]*@(.{0,2})[^.]*(\..*)?$"),
        sql.Literal(r"\1******@\2******\3"),
    ),
    "hash": lambda a: _fn(
        "encode",
        _fn("sha256", _fn("convert_to", _text(a[0]), sql.Literal("UTF8"))),
        sql.Literal("hex"),
    ),
}


def _call(expr: Call, args: _Args) -> sql.Composable:
    schema, name = expr.name.split(".", 1)
    if schema == "anon":
        return _ANON[name](args)
    if name == "gen_random_uuid":
        return _uuid(args)
    if name in ("left", "right"):
        return _fn(name, _text(args[0]), args[1])
    return _fn(name, *(_text(a) for a in args))


def _assignment(mask: ColumnMask) -> sql.Composable:
    value = (
        sql.Literal(mask.value)
        if mask.function is None
        else render(parse(mask.function, mask.column), mask.column)
    )
    return sql.SQL("{} = {}").format(sql.Identifier(mask.column), value)


# Errors of the moment (a connection lost, the compute stopping, a lock or serialization
# conflict, resources short): the operation's retry may succeed. Any other is the rules'.
_PASSING = ("08", "40", "53", "57")


def _failed(what: str, exc: psycopg.Error) -> ComputeError:
    # A refused connection's FATAL may come without its SQLSTATE: its words say it.
    gone = exc.sqlstate is None and "does not exist" in str(exc)
    if not gone and (exc.sqlstate is None or exc.sqlstate.startswith(_PASSING)):
        return ComputeError(f"{what}: {exc}")
    return MaskingFailed(f"{what}: {exc}")


_TABLE = (
    "SELECT c.relkind, pg_catalog.pg_get_userbyid(c.relowner), r.rolsuper,"
    " (SELECT pg_catalog.array_agg(a.attname::text) FROM pg_catalog.pg_attribute a"
    "   WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),"
    " (SELECT pg_catalog.array_agg(t.tgname::text) FROM pg_catalog.pg_trigger t"
    "   WHERE t.tgrelid = c.oid AND t.tgenabled IN ('A', 'R'))"
    " || (SELECT pg_catalog.array_agg(w.rulename::text) FROM pg_catalog.pg_rewrite w"
    "   WHERE w.ev_class = c.oid AND w.ev_enabled IN ('A', 'R'))"
    " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
    " JOIN pg_catalog.pg_roles r ON r.oid = c.relowner WHERE n.nspname = %s AND c.relname = %s"
)


async def _owner(conn: psycopg.AsyncConnection, where: str, masks: list[ColumnMask]) -> str:
    """The table's owner, once it is known to be a table of the tenant's holding every
    column masked and with nothing that would fire during the masking."""
    first = masks[0]
    cur = await conn.execute(_TABLE, (first.schema, first.table))
    row = await cur.fetchone()
    if row is None:
        raise MaskingFailed(f"table {where} does not exist")
    kind, owner, superuser, columns, firing = row
    if kind not in ("r", "p"):
        raise MaskingFailed(f"{where} is not a table: only a table's rows are masked")
    if superuser:
        raise MaskingFailed(f"table {where} belongs to the platform's superuser")
    missing = [m.column for m in masks if m.column not in (columns or [])]
    if missing:
        raise MaskingFailed(f"table {where} has no column {missing[0]!r}")
    if firing:
        raise MaskingFailed(
            f"table {where} has triggers or rules that fire during any update ({firing[0]}:"
            " ENABLE ALWAYS or REPLICA); disable them, or make them ordinary, first"
        )
    return str(owner)


async def _mask_database(
    socket_dir: Path, port: int, database: str, masks: list[ColumnMask]
) -> int:
    tables: dict[tuple[str, str], list[ColumnMask]] = defaultdict(list)
    for m in masks:
        tables[(m.schema, m.table)].append(m)
    try:
        conn = await connect(admin_conninfo(socket_dir, port, database))
    except psycopg.Error as exc:  # 3D000: no such database, the rules'
        raise _failed(f"database {database!r}", exc) from exc
    async with conn:
        try:
            async with conn.transaction():
                await conn.execute("SET LOCAL session_replication_role = replica")
                await conn.execute("SET LOCAL search_path = pg_catalog, pg_temp")
                for (schema, table), columns in tables.items():
                    where = f"{database}.{schema}.{table}"
                    owner = await _owner(conn, where, columns)
                    await conn.execute(sql.SQL("SET LOCAL ROLE {}").format(sql.Identifier(owner)))
                    await conn.execute("SET LOCAL row_security = off")
                    await conn.execute(
                        sql.SQL("UPDATE {}.{} SET {}").format(
                            sql.Identifier(schema),
                            sql.Identifier(table),
                            sql.SQL(", ").join(_assignment(m) for m in columns),
                        )
                    )
                    await conn.execute("RESET ROLE")
            for schema, table in tables:
                await conn.execute(
                    sql.SQL("VACUUM {}.{}").format(sql.Identifier(schema), sql.Identifier(table))
                )
        except psycopg.Error as exc:
            raise _failed(f"masking {database!r}", exc) from exc
    return len(masks)


async def mask(socket_dir: Path, port: int, masks: Sequence[ColumnMask]) -> int:
    """Apply ``masks`` on the postmaster at ``socket_dir``/``port``, database by database."""
    by_database: dict[str, list[ColumnMask]] = defaultdict(list)
    for m in masks:
        by_database[m.database].append(m)
    done = 0
    for database, masks_of in by_database.items():
        done += await _mask_database(socket_dir, port, database, masks_of)
        # Killed here, the retry masks every database again: masked values masked anew.
        await failpoints.reached("anonymize:database_masked")
    return done
