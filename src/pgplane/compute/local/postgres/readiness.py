"""When a postmaster serves: its pid file's status line, read safely, and its log's tail.

The pid file is the tenant's: it is read here only to learn whether the tenant's own compute
is up (``pg_ctl -w``'s question), never where a compute is (:mod:`.records` says that).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import psycopg

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres.pidfile import PidFile, read_pid_file
from pgplane.compute.local.postgres.sessions import admin_conninfo
from pgplane.compute.local.tenants import untrusted

READY_TIMEOUT = 30.0
PID_FILE = "postmaster.pid"
_STATUS_LINE = 7  # of postmaster.pid: LOCK_FILE_LINE_PM_STATUS (miscadmin.h), 1-based 8
_POLL = 0.001


def log_tail(path: Path, size: int = 2000, *, start: int = 0) -> str:
    """The last ``size`` bytes the log has past offset ``start`` (what this start wrote)."""
    try:
        with path.open("rb") as f:  # root's: logs/ and branch directories are root's
            f.seek(max(start, f.seek(0, os.SEEK_END) - size))
            return f.read().decode(errors="replace").strip()
    except OSError as exc:
        return f"(log unreadable: {exc})"


def log_size(path: Path) -> int:
    """Where the log ends now: what a start writes comes after it."""
    try:
        return path.stat().st_size  # root's: logs/ and branch directories are root's
    except OSError:
        return 0


def exit_said(status: int | None) -> str:
    """How a postmaster that exited during start-up ended, in words (``status``: its exit
    status as Popen gives it, or a sandbox's, which reports a signal as 128 + its number)."""
    if status is None:
        return ""
    signo = -status if status < 0 else status - 128 if status > 128 else None
    if signo == signal.SIGKILL:
        return (
            " (killed: most often out of memory for its compute size; settings such as"
            " shared_buffers or max_connections ask for more than its compute units give)"
        )
    if signo is not None:
        with contextlib.suppress(ValueError):
            return f" (killed by {signal.Signals(signo).name})"
    return f" (exit status {status})"


async def wait_ready(
    pgdata: Path,
    socket_dir: Path,
    port: int,
    *,
    alive: Callable[[], bool],
    log_path: Path,
    log_from: int = 0,
    status: Callable[[], int | None] = lambda: None,
    time_limit: float = READY_TIMEOUT,
    stale: int | None = None,
    confirm: bool = True,
) -> None:
    """Poll until the postmaster says it accepts connections, as ``pg_ctl -w`` does, then (with
    ``confirm``) log in once to be sure.

    Accepting a connection is not enough: a postmaster still recovering answers "the database
    system is starting up". Postgres writes ``ready`` into its pid file's status line when it
    is past recovery and serving (PM_STATUS_READY), and its socket exists before that. That
    line is the tenant's to write: a tenant can only make its own compute look ready early.
    One login once it says so (not a startup packet each poll) confirms it for a postmaster
    found running: one killed a moment ago leaves a pid file and a socket that say "ready" too.
    A postmaster just spawned needs none (``confirm=False``): its pid file is the one written
    after ``stale``, the modification time (ns) of the one a killed postmaster left, and while
    it lives (``alive``) its "ready" is its own; the wake saves a backend's fork and exit.
    Polling every millisecond keeps a cold start at tens of milliseconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + time_limit
    socket = socket_dir / f".s.PGSQL.{port}"
    while True:
        # Alive first: a postmaster that died leaves a pid file and a socket that say "ready".
        if not alive():
            said = log_tail(log_path, start=log_from) or "(nothing: it logged no word)"
            raise ComputeError(
                f"postmaster exited during start-up{exit_said(status())}; its log: {said}"
            )
        if await asyncio.to_thread(_says_ready, pgdata, socket, stale) and (
            not confirm or await _logs_in(socket_dir, port)
        ):
            return
        if loop.time() >= deadline:
            raise ComputeError(
                f"postmaster not ready after {time_limit:.0f} s; its log:"
                f" {log_tail(log_path, start=log_from)}"
            )
        await asyncio.sleep(_POLL)


class SocketReplaced(ComputeError):
    """Something the tenant put where its compute's socket was: no attempt of this compute's
    work can succeed until its postmaster makes the socket again (a stop removes what is there,
    the next start makes a new one), so the operation fails at once, saying why, rather than
    retry for a minute while the client that woke the compute waits."""

    permanent = True


def _says_ready(pgdata: Path, socket: Path, stale: int | None) -> bool:
    try:
        fd = untrusted.open_regular(untrusted.under(pgdata, PID_FILE))
    except OSError:
        return False
    try:
        if stale is not None and os.fstat(fd).st_mtime_ns <= stale:
            return False  # a dead postmaster's
        lines = os.read(fd, 4096).decode(errors="replace").splitlines()
    finally:
        os.close(fd)
    if len(lines) <= _STATUS_LINE or lines[_STATUS_LINE].strip() != "ready":
        return False
    try:
        found = os.lstat(socket)  # the tenant's directory: never through its link
    except OSError:
        return False
    if not stat.S_ISSOCK(found.st_mode):
        # Postgres makes its socket itself: anything else there is the tenant's doing (a link
        # to another account's compute, say), and no login through it will ever be ours.
        raise SocketReplaced(f"the compute's socket {socket.name} is not a socket: replaced")
    return True


def stale_pid_file(pgdata: Path) -> tuple[int | None, PidFile | None]:
    """What a postmaster that died left (a clean stop removes it): when it was last written
    (ns), and what it says (a safe look: the tenant's)."""
    try:
        fd = untrusted.open_regular(untrusted.under(pgdata, PID_FILE))
    except OSError:
        return None, None
    try:
        mtime = os.fstat(fd).st_mtime_ns
    finally:
        os.close(fd)
    return mtime, read_pid_file(pgdata)


async def _logs_in(socket_dir: Path, port: int) -> bool:
    """Whether the platform's own startup is taken: what "ready" must mean for the clients that
    follow (a pid file and a socket a killed postmaster left say "ready" too, for a moment)."""
    try:
        async with asyncio.timeout(10.0):
            conn = await psycopg.AsyncConnection.connect(admin_conninfo(socket_dir, port))
    except (psycopg.OperationalError, TimeoutError):
        return False
    await conn.close()
    return True
