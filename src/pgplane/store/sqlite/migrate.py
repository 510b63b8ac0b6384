"""Versioned schema migrations: numbered SQL files, each applied once, in order, atomically."""

from __future__ import annotations

import logging
import re
import sqlite3
from importlib import resources

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


def migrations() -> list[tuple[int, str, str]]:
    folder = resources.files("pgplane.store.sqlite") / "migrations"
    found = []
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the schema up to date; returns the resulting version.

    Runs under ``BEGIN IMMEDIATE`` so two processes starting together apply each migration once.
    A schema already up to date is seen by a read, without the write lock: a CLI command run
    while ``serve`` writes waits for the lock where it says so (cli/common.py), not here.
    """
    done = _applied(conn)
    if done is not None and all(version in done for version, _, _ in migrations()):
        return max(done, default=0)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
        )
        applied = {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
        current = max(applied, default=0)
        for version, name, sql in migrations():
            if version in applied:
                continue
            log.info("applying store migration %s", name)
            # executescript would commit the open transaction; run statement by statement.
            for statement in split(sql):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, datetime('now'))", (version, name)
            )
            current = version
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return current


def _applied(conn: sqlite3.Connection) -> set[int] | None:
    """The versions applied, or None on a store without migrations yet."""
    try:
        return {row[0] for row in conn.execute("SELECT version FROM schema_migrations")}
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return None
        raise


def split(sql: str) -> list[str]:
    """Split a migration into statements (no semicolons inside our statements' literals)."""
    lines = [line for line in sql.splitlines() if not line.strip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]
