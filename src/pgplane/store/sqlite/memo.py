"""The answers of the API's hottest reads on SQLite, kept while the store has not changed.

Every authenticated request looks its key up, and a client polling its operations reads the same
page again and again: under load those two statements were a fifth of a request's cost. Their
answers are kept here, and thrown away as soon as anything in the store changes.

"Changed" is SQLite's own word for it: ``PRAGMA data_version`` on the reader connection moves
whenever another connection has committed since the reader last looked, be it this process's
writer or another process (the CLI revoking a key). The reader never writes (``query_only``), so
nothing can change the store without moving it.

It is asked once a turn of the event loop, at the turn's first read, and not again until the
next turn: every request served in a turn was received before the turn began (a request's task
starts the turn after its bytes were read), so whatever was committed before a request arrived (a
key revoked, an operation finished) is seen by it, as it would be reading the tables. A commit of
this process's writer, which may come within a turn, throws the answers away at once
(:meth:`ReadMemo.forget`). So the check costs one statement a turn, not one per read: asked per
read, it cost a third of what the kept answers saved.

Only what :class:`~pgplane.store.sqlite.tx.SqliteTx` returns unchanged is kept (frozen structs; a
list is copied before it is handed out), and only found things: a flood of unknown keys fills
nothing. On PostgreSQL (other nodes commit, and no counter says so) nothing is kept.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Hashable
from typing import Any

# What may be kept, in rows (a key is one, a page of operations one a row: a page can hold a
# thousand): more than a node's live keys and polled pages, a few MB at most. Past it everything
# is dropped, and the next requests fill it again.
MAX_ROWS = 20_000


class ReadMemo:
    """Answers of the reader connection ``conn``, valid while the store is unchanged."""

    __slots__ = ("_answers", "_checked", "_conn", "_rows", "_version")

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._version: int | None = None
        # The loop whose current turn has checked (a store outliving its loop checks in the next).
        self._checked: asyncio.AbstractEventLoop | None = None
        self._answers: dict[Hashable, Any] = {}
        self._rows = 0

    def current(self) -> dict[Hashable, Any]:
        """The answers that still hold: none once the store has changed since they were read.
        Read from it; add to it with :meth:`keep`."""
        loop = asyncio.get_running_loop()
        if self._checked is not loop:
            version = self._conn.execute("PRAGMA data_version").fetchone()[0]
            if version != self._version:
                self._version = version
                self.forget()
            self._checked = loop
            # Run at the start of the next turn, before the tasks of the requests read meanwhile.
            loop.call_soon(self._next_turn)
        return self._answers

    def _next_turn(self) -> None:
        self._checked = None

    def keep(self, asked: Hashable, answer: Any, rows: int = 1) -> None:
        """Keep ``answer`` (read after :meth:`current`, in the same turn) to what was ``asked``."""
        if self._rows + rows > MAX_ROWS:
            self.forget()
        self._answers[asked] = answer
        self._rows += rows

    def forget(self) -> None:
        """This process's writer committed: nothing kept may be answered again."""
        self._answers.clear()
        self._rows = 0
