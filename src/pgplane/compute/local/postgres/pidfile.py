"""Postmaster identity, read from the data directory: ``postmaster.pid`` checked against /proc.

The pid file alone is not proof: after a crash or a reboot it may name a dead pid, or a pid the
kernel has since given to another process. A pid counts only if it is alive and, where /proc
exists, is a postgres binary whose working directory is that data directory.
"""

from __future__ import annotations

import contextlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

_HAS_PROC = Path("/proc/self").is_dir()
_PID_FILE_MAX = 4096


@dataclass(frozen=True, slots=True)
class PidFile:
    """What the postmaster records in ``postmaster.pid`` (see miscadmin.h LOCK_FILE_LINE_*)."""

    pid: int
    port: int | None
    socket_dir: str | None
    status: str | None


def read_pid_file(pgdata: Path) -> PidFile | None:
    try:
        lines = _read_small(pgdata / "postmaster.pid").splitlines()
        pid = abs(int(lines[0]))  # a standalone backend writes -pid
    except (OSError, ValueError, IndexError):
        return None

    def line(i: int) -> str | None:
        return lines[i].strip() if len(lines) > i and lines[i].strip() else None

    port = line(3)
    return PidFile(
        pid=pid,
        port=int(port) if port and port.isdigit() else None,
        socket_dir=line(4),
        status=line(7),
    )


def _read_small(path: Path) -> str:
    """A small regular file's text. The data directory is a tenant's: a link or a FIFO put in
    place of the pid file must neither lead root's read elsewhere nor block it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        return os.read(fd, _PID_FILE_MAX).decode(errors="replace")
    finally:
        os.close(fd)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if _HAS_PROC:
        with contextlib.suppress(OSError):
            # A zombie answers signal 0 but is gone for our purposes.
            stat = Path(f"/proc/{pid}/stat").read_text()
            return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def is_postmaster_of(pid: int, pgdata: Path) -> bool:
    """Whether ``pid`` is a live postgres whose working directory is ``pgdata``."""
    if not alive(pid):
        return False
    if not _HAS_PROC:  # macOS: no cheap way to read another process's cwd; trust the pid file
        return True
    try:
        # The postmaster chdirs into its data directory at start-up (ChangeToDataDir).
        cwd = os.readlink(f"/proc/{pid}/cwd")
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
    except OSError:
        return False
    return cwd == os.path.realpath(pgdata) and Path(exe).name.startswith("postgres")


def processes_in(pgdata: Path) -> list[int]:
    """Every live postgres process working in ``pgdata``: its postmaster and all it forked.

    A postmaster chdirs into its data directory and its children inherit that; the working
    directory (not the process group: each child makes itself a group leader) is what ties a
    backend to its data directory after its postmaster is gone. Empty without /proc.
    """
    if not _HAS_PROC:
        return []
    found = []
    target = os.path.realpath(pgdata)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.readlink(proc / "cwd") != target:
                continue
            exe = os.readlink(proc / "exe").removesuffix(" (deleted)")
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if Path(exe).name.startswith("postgres") and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def command_line(pid: int) -> list[str] | None:
    """The postmaster's arguments (it never rewrites its own process title), if readable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]
