"""Empty files and directories made ahead of time, so that copying a small cluster is quick.

On some filesystems creating an inode costs far more than anything else in copying a small file:
on the ext4 of the VMs we measure on, a create is ~0.66 ms against ~0.02 ms for a rename and
~0.01 ms for writing 8 kB. A fresh cluster is ~1,300 files and ~40 MB, so its copy is almost
all creates. A branch therefore takes its files and directories from this pool by renaming them
into place, and the pool is refilled in the background afterwards: the platform keeps the slow
part ready, as a hosted platform keeps warm computes ready.

A spare is exactly what a create would have made: empty, owned by this process, mode 0600 for a
file and 0700 for a directory (the copy then sets mode and owner as for any new file). Spares live
in ``<data_dir>/spare/``, on the same filesystem as the projects; a rename that meets another
filesystem turns the pool off. A crash leaves at most empty spares, which the next process adopts
(anything else found there is removed).

The pool holds as many spares as its user asks for (the driver: twice the largest branch since
start-up, up to a cap): a platform that never branches never makes any.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import os
import secrets
import shutil
import stat
import threading
from collections import deque
from pathlib import Path

log = logging.getLogger(__name__)

# A cap on the pool: a branch of a larger parent creates the rest (and its data dominates then).
MAX_FILES = 10_000
MAX_DIRS = 500


class SparePool:
    """Spare empty files and directories in one directory; safe to use from several threads."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self._files: deque[str] = deque()
        self._dirs: deque[str] = deque()
        self._want_files = 0
        self._want_dirs = 0
        self._names = (f"{secrets.token_hex(4)}-{n}" for n in itertools.count())
        self._enabled = True
        self._stopping = False

    def disable(self) -> None:
        """Never make spares (the copies land on filesystems the pool is not on)."""
        with self._lock:
            self._enabled = False

    def counts(self) -> tuple[int, int]:
        """Spare files and directories ready now."""
        with self._lock:
            return len(self._files), len(self._dirs)

    def adopt(self) -> None:
        """Take over the spares a previous process left; remove anything else found there."""
        self.directory.mkdir(mode=0o700, exist_ok=True)
        uid = os.geteuid()
        with os.scandir(self.directory) as it:
            entries = list(it)
        files, dirs = [], []
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            if (
                stat.S_ISREG(st.st_mode)
                and st.st_size == 0
                and st.st_nlink == 1
                and st.st_uid == uid
            ):
                files.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not os.listdir(entry.path):
                dirs.append(entry.path)
            elif stat.S_ISDIR(st.st_mode) and not stat.S_ISLNK(st.st_mode):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
        with self._lock:
            self._files.extend(files)
            self._dirs.extend(dirs)

    def want(self, files: int, dirs: int) -> None:
        """Keep at least this many spares from now on (the largest copy so far)."""
        with self._lock:
            self._want_files = max(self._want_files, min(files, MAX_FILES))
            self._want_dirs = max(self._want_dirs, min(dirs, MAX_DIRS))

    def needs_filling(self) -> bool:
        with self._lock:
            return self._enabled and (
                len(self._files) < self._want_files or len(self._dirs) < self._want_dirs
            )

    def fill(self) -> int:
        """Make spares until the pool holds what it wants (blocking: run it in a thread)."""
        made = 0
        while not self._stopping and self.needs_filling():
            with self._lock:
                short_files = len(self._files) < self._want_files
            path = os.path.join(self.directory, next(self._names))
            try:
                if short_files:
                    os.close(
                        os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
                    )
                else:
                    os.mkdir(path, 0o700)
                    os.chmod(path, 0o700)  # mkdir's mode went through the umask
            except OSError as exc:  # a full disk, say: spares are an optimisation, never a failure
                log.warning("could not make spare files in %s: %s", self.directory, exc)
                return made
            with self._lock:
                (self._files if short_files else self._dirs).append(path)
            made += 1
        return made

    async def fill_logged(self) -> None:
        """:meth:`fill` in a thread, its failure logged: spares only make copies quicker."""
        try:
            made = await asyncio.to_thread(self.fill)
        except Exception:  # a failure must not go unseen, nor fail anything
            log.exception("making spare files in %s", self.directory)
        else:
            log.debug("made %d spare files and directories", made)

    def stop(self) -> None:
        """Make a running :meth:`fill` return after the spare it is making."""
        self._stopping = True

    def place_file(self, dst: str) -> bool:
        """Rename a spare file to the new path ``dst``; False if there is none to take."""
        return self._place(self._files, dst)

    def place_dir(self, dst: str) -> bool:
        """Rename a spare directory to the new path ``dst``; False if there is none to take."""
        return self._place(self._dirs, dst)

    def _place(self, spares: deque[str], dst: str) -> bool:
        if not self._enabled:
            return False
        with self._lock:
            if not spares:
                return False
            spare = spares.popleft()
        if os.path.lexists(dst):
            # rename(2) would replace it silently; the caller's create reports it instead.
            with self._lock:
                spares.appendleft(spare)
            return False
        try:
            os.rename(spare, dst)
        except OSError as exc:
            if exc.errno == errno.EXDEV:
                self._enabled = False  # another filesystem: creates it is
                log.info("spare files in %s are on another filesystem: not used", self.directory)
            elif exc.errno != errno.ENOENT:  # ENOENT: removed by hand; take the next
                raise
            return False
        return True
