"""One ``serve`` per data directory: an exclusive lock on ``<data_dir>/serve.lock``.

Two servers on one data directory would run two engines, two schedulers and two proxies over
the same store and the same postmasters. The lock is ``flock(2)``'s: the kernel drops it when
its holder dies however it dies (SIGKILL included), so a stale lock never blocks a start, and
the descriptor is close-on-exec, so the postmasters a server starts (which outlive it by
design) never hold it. The file says which process holds it, for the refusal.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

LOCK_NAME = "serve.lock"


class AlreadyServing(Exception):
    """Another ``serve`` holds the data directory."""

    def __init__(self, data_dir: Path, pid: int | None) -> None:
        holder = f"pgplane serve (pid {pid})" if pid else "another pgplane serve"
        super().__init__(
            f"{holder} is already running on {data_dir}; stop it first, or give this one"
            " another --data-dir"
        )
        self.pid = pid


class ServerLock:
    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock, or raise AlreadyServing naming its holder (at once, never waits)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _holder(fd)
            os.close(fd)
            raise AlreadyServing(self.path.parent, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            # Emptied first: a holder's pid left in the file would name a process long gone.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
