"""What ``postmaster.pid`` says, read safely: only ever a hint, never where a compute is.

The file is the tenant's (DESIGN §6): the platform reads it for one thing, whether a postmaster
ended uncleanly (a clean stop removes it), and then only ends processes of the data's own user
working in that directory. Which process serves a data directory, on which port and socket, is
the platform's own record (:mod:`.records`). ``is_postmaster_of`` and ``command_line`` remain
for tests and benchmarks, which look at what runs from outside.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.local.tenants import untrusted

_HAS_PROC = Path("/proc/self").is_dir()


@dataclass(frozen=True, slots=True)
class PidFile:
    """What the postmaster records in ``postmaster.pid`` (see miscadmin.h LOCK_FILE_LINE_*)."""

    pid: int
    port: int | None
    socket_dir: str | None
    status: str | None


def read_pid_file(pgdata: Path) -> PidFile | None:
    try:
        lines = untrusted.read_text(untrusted.under(pgdata, "postmaster.pid"), 4096).splitlines()
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
            stat = Path(f"/proc/{pid}/stat").read_text()  # root's: the kernel's
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


def processes_in(pgdata: Path, uid: int | None = None) -> list[int]:
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
        if uid is not None and proc.stat().st_uid != uid:
            continue  # only the data's own user's: never another account's process
        if Path(exe).name.startswith("postgres") and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def command_line(pid: int) -> list[str] | None:
    """The postmaster's arguments (it never rewrites its own process title), if readable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()  # root's: the kernel's
    except OSError:
        return None
    return [os.fsdecode(a) for a in raw.split(b"\0")[:-1]]
