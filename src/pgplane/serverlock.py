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


def _serving_dir() -> Path:
    """Where each running ``serve`` of this user notes its data directory (one file per
    process), so the CLI run without ``--data-dir`` finds the platform that runs."""
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "pgplane" / "serving"


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
        self._note: Path | None = None

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
        self._note = _serving_dir() / str(os.getpid())
        with contextlib.suppress(OSError):  # a convenience for the CLI: never a reason to stop
            self._note.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._note.write_text(f"{self.path.parent.resolve()}\n")

    def release(self) -> None:
        if self._note is not None:
            with contextlib.suppress(OSError):
                self._note.unlink()
            self._note = None
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


def serving() -> list[Path]:
    """The data directories this user's running ``serve`` processes hold, as they noted them;
    a note whose server is gone (killed: its lock went with it) is removed."""
    found = []
    try:
        notes = list(_serving_dir().iterdir())
    except OSError:
        return []
    for note in notes:
        try:
            data_dir = Path(note.read_text().strip())
        except (OSError, UnicodeDecodeError):
            continue
        if data_dir.is_absolute() and held(data_dir):
            found.append(data_dir)
        else:
            with contextlib.suppress(OSError):
                note.unlink()
    return sorted(set(found))


def held(data_dir: Path) -> bool:
    """Whether a ``serve`` holds the data directory's lock now."""
    try:
        fd = os.open(data_dir / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False
