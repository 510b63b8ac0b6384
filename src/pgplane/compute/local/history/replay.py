"""The temporary postmaster that replays a branch's archive on a copy of a base state.

It runs as the project's user, on a socket only the platform reaches, with no TCP listener, no
archiving of its own (it must never write into the source's archive) and no hot standby (it
answers only once promoted, so a client can never see a half-replayed state). What it was told
(target, restore command, log level) is on its command line, over anything the copied
configuration says. Its log says which files it fetched from the archive, for the caller to
check against their checksums.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import re
import shutil
from pathlib import Path

import psycopg

from pgplane.compute.driver import ComputeError, Point
from pgplane.compute.local.copies.timeline import INIT_PORT, fresh_socket_dir
from pgplane.compute.local.history.archiving import (
    HistoryDirs,
    restore_command,
)
from pgplane.compute.local.history.wal import parse_lsn, wal_files
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.command import postmaster_argv
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.sessions import ADMIN_USER, connect, conninfo
from pgplane.compute.local.tenants import untrusted
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

_NOT_REACHED = "recovery ended before configured recovery target was reached"


RESTORED = re.compile(r'restored log file "([0-9A-F]{8}(?:[0-9A-F]{16}|\.history))" from archive')


_REPLAY_TIMEOUT = 3600.0
_LOG_LIMIT = 8 << 20  # the "restored log file" lines of a long replay fit many times over
_HISTORY_LIMIT = 1 << 20  # a timeline history file: a line per switch


POLL = 0.05


def format_lsn(lsn: int) -> str:
    return f"{lsn >> 32:X}/{lsn & 0xFFFFFFFF:X}"


def pg_time(time_us: int) -> str:
    moment = datetime.datetime.fromtimestamp(time_us / 1_000_000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f+00")


class TargetNotReached(Exception):
    pass


async def replay(
    install: PgInstall,
    run_as: RunAs,
    postmasters: Postmasters,
    source: HistoryDirs,
    tmp: Path,
    socket_dir: Path,
    hba_file: Path,
    point: Point | None,
    restored: set[str],
    *,
    limits: Limits | None = None,
) -> int:
    settings = {
        "restore_command": restore_command(source.wal),
        # Its log names each file fetched from the archive (at LOG), whatever the copy's own
        # configuration says: those are checked against their checksums before publishing.
        "log_min_messages": "warning",
        "recovery_target_timeline": "latest",
        "recovery_target_action": "promote",
        "archive_mode": "off",
        # No read-only sessions while it replays (it answers once promoted): hot standby would
        # also pause the replay when this postmaster's limits are below the source compute's.
        "hot_standby": "off",
        # Safe: the caller flushes every file before publishing, and a crash discards the copy.
        "fsync": "off",
    }
    if point is not None and point.lsn is not None:
        settings["recovery_target_lsn"] = format_lsn(point.lsn)
        settings["recovery_target_inclusive"] = "off"
    elif point is not None and point.time_us is not None:
        settings["recovery_target_time"] = pg_time(point.time_us)
    run_as.chown(tmp / "recovery.signal")
    await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
    argv = postmaster_argv(
        install,
        tmp,
        port=INIT_PORT,
        socket_dir=socket_dir,
        listen="",  # nobody but us reaches a copy being rebuilt
        settings=settings,
        hba_file=hba_file,
    )
    log_path = tmp.parent / "rebuild.log"
    log_path.unlink(missing_ok=True)
    try:
        try:
            await postmasters.start(
                argv,
                pgdata=tmp,
                port=INIT_PORT,
                socket_dir=socket_dir,
                run_as=run_as,
                log_path=log_path,
                spawned="rebuild:replaying",
                readable=[source.wal],  # its restore_command's archive (another branch's, say)
                ready_timeout=_REPLAY_TIMEOUT,  # it answers once promoted
                limits=limits,
            )
            await _wait_promoted(socket_dir, postmasters, tmp)
        except ComputeError as exc:
            if _NOT_REACHED in str(exc) or _NOT_REACHED in await _log_text(log_path):
                raise TargetNotReached from exc
            raise
    finally:
        await postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, socket_dir, True)
        restored.update(RESTORED.findall(await _log_text(log_path)))
    return await asyncio.to_thread(_switch_point, tmp)


async def _wait_promoted(socket_dir: Path, postmasters: Postmasters, tmp: Path) -> None:
    info = conninfo(socket_dir, INIT_PORT, user=ADMIN_USER)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _REPLAY_TIMEOUT
    while True:
        if postmasters.running(tmp) is None:
            raise ComputeError("the rebuilding postmaster exited during the replay")
        try:
            async with asyncio.timeout(10.0):
                conn = await connect(info)
                async with conn:
                    cur = await conn.execute("SELECT pg_catalog.pg_is_in_recovery()")
                    row = await cur.fetchone()
        except (psycopg.Error, TimeoutError) as exc:
            row = None
            log.debug("rebuild: %s", exc)
        if row is not None and not row[0]:
            return
        if loop.time() >= deadline:
            raise ComputeError(f"the replay did not end within {_REPLAY_TIMEOUT:.0f} s")
        await asyncio.sleep(POLL)


async def _log_text(path: Path) -> str:
    """The replay's log: root's file, but its postmaster (the tenant's user) writes all of it."""
    return await untrusted.atext_or_empty(untrusted.under(path.parent, path.name), _LOG_LIMIT)


def _switch_point(pgdata: Path) -> int:
    """Where the promoted copy's timeline branched off: the last line of its history file."""
    _, histories = wal_files(pgdata / "pg_wal")
    if not histories:
        raise ComputeError("the rebuilt copy has no timeline history: it was not promoted")
    newest = max(histories, key=lambda n: int(n[:8], 16))
    # The copy is the tenant's while its postmaster runs: the file may be anything by now.
    try:
        text = untrusted.read_text(untrusted.under(pgdata, f"pg_wal/{newest}"), _HISTORY_LIMIT)
    except OSError as exc:
        raise ComputeError(f"timeline history {newest} of the rebuilt copy: {exc}") from None
    lines = [
        line.split() for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    if not lines or len(lines[-1]) < 2:
        raise ComputeError(f"timeline history {newest} of the rebuilt copy is empty")
    return parse_lsn(lines[-1][1])
