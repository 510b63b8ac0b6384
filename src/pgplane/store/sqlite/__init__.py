"""The embedded default store: one SQLite file in WAL mode."""

from pgplane.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
