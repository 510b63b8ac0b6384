"""Both backends' schemas agree: every migration applied to a fresh SQLite file and to a fresh
PostgreSQL database (through store/postgresql/migrate.py's rewrites) gives the same tables,
columns (type, nullability, default, generated ids), primary keys, unique and partial indexes
and foreign keys. A migration written in SQL only one engine reads the same way fails here.

(procrastinate proves its migrations the same way: the schema built by migrating agrees with
the one written out whole.)
"""

from __future__ import annotations

import ast
import re
import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from pgplane.store.postgresql.migrate import migrate as pg_migrate
from pgplane.store.sqlite.migrate import migrate as sqlite_migrate
from pgplane.store.sqlite.migrate import migrations
from tests.pgstore import store_cluster

Schema = dict[str, Any]

# Types as SQLite names them, and what PostgreSQL holds for each.
_PG_TYPES = {"bigint": "INTEGER", "text": "TEXT", "double precision": "REAL"}
_SQL_WORDS = {"and", "or", "is", "not", "null", "in", "any", "array", "text", "bigint"}


def _predicate(sql: str | None) -> tuple[frozenset[str], frozenset[str]] | None:
    """A partial index's condition as the names and literals it uses: SQLite keeps the text
    written, PostgreSQL its own rendering (``status = ANY (ARRAY['a'::text, …])``)."""
    if sql is None:
        return None
    literals = re.findall(r"'([^']*)'", sql)
    names = set(re.findall(r"[a-z_]+", re.sub(r"'[^']*'", "", sql.lower()))) - _SQL_WORDS
    return frozenset(names), frozenset(literals)


def _default(value: str | None) -> str | None:
    return None if value is None else re.sub(r"::(text|bigint|integer)$", "", value)


def sqlite_schema(path: Path) -> Schema:
    with sqlite3.connect(path, isolation_level=None) as db:
        sqlite_migrate(db)
        tables = [
            (name, sql)
            for name, sql in db.execute(
                "SELECT name, sql FROM sqlite_master WHERE type = 'table'"
                " AND name NOT LIKE 'sqlite_%' ORDER BY name"
            )
        ]
        schema: Schema = {"columns": {}, "indexes": {}, "constraints": set(), "fks": set()}
        for table, table_sql in tables:
            cols = {}
            for _, name, kind, notnull, default, pk in db.execute(f"PRAGMA table_info({table})"):
                generated = bool(pk) and "AUTOINCREMENT" in table_sql
                cols[name] = (kind, bool(notnull or pk), _default(default), pk, generated)
            schema["columns"][table] = cols
            # An INTEGER PRIMARY KEY is the rowid itself, with no index: its key is counted here.
            key = tuple(n for n, c in sorted(cols.items(), key=lambda kv: kv[1][3]) if c[3])
            if key:
                schema["constraints"].add((table, key))
            for _, index, unique, origin, _ in db.execute(f"PRAGMA index_list({table})"):
                columns = tuple(r[2] for r in db.execute(f"PRAGMA index_info({index})"))
                if origin in ("u", "pk"):
                    schema["constraints"].add((table, columns))
                    continue
                (index_sql,) = db.execute(
                    "SELECT sql FROM sqlite_master WHERE name = ?", (index,)
                ).fetchone()
                where = index_sql.split(" WHERE ", 1)[1] if " WHERE " in index_sql else None
                schema["indexes"][index] = (table, bool(unique), columns, _predicate(where))
            for fk in db.execute(f"PRAGMA foreign_key_list({table})"):
                schema["fks"].add((table, fk[3], fk[2], fk[4]))
    return schema


_PG_COLUMNS = """
SELECT c.table_name, c.column_name, c.data_type, c.is_nullable = 'NO', c.column_default,
       c.is_identity = 'YES', c.collation_name,
       COALESCE((SELECT array_position(i.indkey::int2[], a.attnum::int2) + 1
                 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
                 WHERE i.indrelid = (quote_ident(c.table_name))::regclass AND i.indisprimary
                   AND a.attname = c.column_name), 0)
FROM information_schema.columns c
WHERE c.table_schema = current_schema()
ORDER BY c.table_name, c.ordinal_position
"""
_PG_INDEXES = """
SELECT t.relname, x.relname, i.indisunique,
       ARRAY(SELECT a.attname FROM unnest(i.indkey) WITH ORDINALITY k(n, o)
             JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.n ORDER BY k.o),
       pg_get_expr(i.indpred, i.indrelid),
       EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)
FROM pg_index i JOIN pg_class t ON t.oid = i.indrelid JOIN pg_class x ON x.oid = i.indexrelid
WHERE t.relnamespace = current_schema()::regnamespace
"""
_PG_FKS = """
SELECT t.relname, a.attname, r.relname, ra.attname
FROM pg_constraint c JOIN pg_class t ON t.oid = c.conrelid JOIN pg_class r ON r.oid = c.confrelid
JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
JOIN pg_attribute ra ON ra.attrelid = c.confrelid AND ra.attnum = c.confkey[1]
WHERE c.contype = 'f' AND t.relnamespace = current_schema()::regnamespace
"""


async def pg_schema(url: str) -> Schema:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await pg_migrate(conn)
        schema: Schema = {"columns": {}, "indexes": {}, "constraints": set(), "fks": set()}
        for row in await (await conn.execute(_PG_COLUMNS)).fetchall():
            table, name, kind, notnull, default, identity, collation, pk = row
            if kind == "text":
                assert collation == "C", (table, name)  # SQLite's bytewise order
            entry = (_PG_TYPES[kind], notnull, _default(default), pk, identity)
            schema["columns"].setdefault(table, {})[name] = entry
        for table, index, unique, columns, where, constraint in await (
            await conn.execute(_PG_INDEXES)
        ).fetchall():
            if constraint:
                schema["constraints"].add((table, tuple(columns)))
            else:
                schema["indexes"][index] = (table, unique, tuple(columns), _predicate(where))
        schema["fks"] = set(await (await conn.execute(_PG_FKS)).fetchall())
    return schema


async def test_both_backends_build_the_same_schema(tmp_path: Path) -> None:
    on_sqlite = sqlite_schema(tmp_path / "schema.db")
    on_pg = await pg_schema(store_cluster().database())
    assert on_pg["columns"] == on_sqlite["columns"]
    assert on_pg["indexes"] == on_sqlite["indexes"]
    assert on_pg["constraints"] == on_sqlite["constraints"]
    assert on_pg["fks"] == on_sqlite["fks"]
    # The comparison saw the schema, not two empty ones.
    assert {"operations", "projects", "api_keys", "usage_hours"} <= set(on_pg["columns"])
    assert "endpoints_one_read_write" in on_pg["indexes"]


async def test_every_migration_is_recorded_on_postgresql() -> None:
    url = store_cluster().database()
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        latest = await pg_migrate(conn)
        assert await pg_migrate(conn) == latest  # a second run applies nothing
        rows = await (await conn.execute("SELECT version, name FROM schema_migrations")).fetchall()
    assert sorted(rows) == [(v, name) for v, name, _ in migrations()]


# Constructs SQLite reads and PostgreSQL does not (or reads otherwise), for the statements that
# run on both: each has a spelling both accept (an upsert, RETURNING, a CASE or a WHERE).
_SQLITE_ONLY = re.compile(
    r"INSERT OR |REPLACE INTO|\b(MAX|MIN)\([^()]*(\([^()]*\))?[^()]*,|IFNULL\(|\bGLOB\b|"
    r"strftime\(|datetime\(|julianday\(|group_concat\(|\btotal\(|\biif\(|lastrowid|LIMIT -1",
    re.IGNORECASE,
)


def _sql_texts(path: Path) -> list[str]:
    """The string literals of a module, docstrings and comments left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_the_shared_statements_use_sql_both_engines_read() -> None:
    folder = Path(__file__).parents[2] / "src/pgplane/store/sqlite"
    shared = [p for p in folder.glob("*.py") if p.name not in ("store.py", "migrate.py")]
    assert len(shared) >= 10
    texts = [(p.name, text) for p in shared for text in _sql_texts(p)]
    assert any("SELECT" in text for _, text in texts)
    found = [f"{name}: {m.group(0)}" for name, text in texts for m in _SQLITE_ONLY.finditer(text)]
    assert not found
