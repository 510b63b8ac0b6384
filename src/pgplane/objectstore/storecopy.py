"""The SQLite store's copy in the object store: accounts, keys, projects and operations come
back with the data.

Every ``store_copy_seconds``, when the store changed since the last copy (SQLite's
``data_version``, which moves with every commit of another connection), SQLite's online backup
takes a consistent copy of it into a file of root's beside it, which goes up sealed as
``store/pgplane.db``: one object, replaced whole (a PUT is atomic), so the bucket always holds a
whole store, at most a copy interval and an upload old. ``recover`` checks what it downloads
with SQLite's own ``integrity_check`` before it writes it into place.

A PostgreSQL store is the operator's own database (backed up as they back up databases) and is
not copied.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.shared.objects import ObjectStore, off_loop
from pgplane.telemetry.metrics import NO_METRICS, Metrics

log = logging.getLogger(__name__)

KEY = "store/pgplane.db"
# The store holds metadata: megabytes, a few hundred at the very most.
MAX_STORE_BYTES = 4 << 30


class StoreCopies:
    def __init__(self, store: ObjectStore, store_path: Path, metrics: Metrics = NO_METRICS) -> None:
        self._store = store
        self._metrics = metrics
        self._path = store_path
        self._staging = store_path.with_name(".store-copy")
        self._conn: sqlite3.Connection | None = None
        self._copied: int | None = None

    def _version(self) -> int:
        if self._conn is None:
            uri = f"file:{self._path}?mode=ro"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        row = self._conn.execute("PRAGMA data_version").fetchone()
        return int(row[0])

    def copy(self, *, force: bool = False) -> bool:
        """One copy up, when the store changed since the last (blocking); whether one went."""
        version = self._version()
        if not force and version == self._copied:
            return False
        assert self._conn is not None  # noqa: S101 - opened by _version
        with contextlib.suppress(FileNotFoundError):
            self._staging.unlink()
        fd = os.open(self._staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        os.close(fd)
        try:
            target = sqlite3.connect(self._staging)
            try:
                self._conn.backup(target)  # one step: a consistent copy of one moment
            finally:
                target.close()
            with self._staging.open("rb") as f:  # root's: made here
                self._store.write(KEY, f, max_bytes=MAX_STORE_BYTES)
        finally:
            self._staging.unlink(missing_ok=True)
        self._copied = version
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def run(self, seconds: float) -> None:
        """Copy every ``seconds`` while the store changes, until cancelled; once more at the
        end (a graceful stop leaves the newest store in the bucket)."""
        try:
            while True:
                try:
                    if await off_loop(self.copy):
                        self._metrics.store_copied(failed=False)
                except (ComputeError, sqlite3.Error, OSError) as exc:
                    self._metrics.store_copied(failed=True)
                    log.warning("the store's copy to the object store failed: %s", exc)
                await asyncio.sleep(seconds)
        finally:
            with contextlib.suppress(ComputeError, sqlite3.Error, OSError):
                await asyncio.shield(asyncio.to_thread(self.copy))
            self.close()


def fetch(store: ObjectStore, dest: Path) -> None:
    """The store's newest copy written to ``dest`` (a new file), checked by SQLite itself."""
    tmp = dest.with_name(f".{dest.name}.recover")
    tmp.unlink(missing_ok=True)
    try:
        _download(store, tmp)
        _check(tmp)
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        result = conn.execute("PRAGMA integrity_check").fetchone()
    finally:
        conn.close()
    if result is None or result[0] != "ok":
        raise ComputeError(f"the store's copy in the object store is damaged: {result}")


def _download(store: ObjectStore, path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with open(fd, "wb") as out:
        try:
            store.read(KEY, out, max_bytes=MAX_STORE_BYTES)
        except FileNotFoundError:
            raise ComputeError("the object store holds no copy of the platform's store") from None
        out.flush()
        os.fsync(out.fileno())
