"""The driver's side of shipped history: the rounds that ship each branch of this node, and a
dead node's project rebuilt here from what it shipped (``shipping`` says what is where).

Locks (the driver's): a round ships a branch under its project's ``("tenant", id)`` lock, as the
keeper keeps it (a detach or reattach moving the tree waits, and a round skips a project whose
tree is moving); a rebuild builds under the branch's ``("timeline", pgdata)`` lock and reads
the history under its ``("history", branch_dir)`` lock, as a point-in-time rebuild does.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence, Set
from pathlib import Path
from typing import NamedTuple

import psycopg

from pgplane.compute.driver import ComputeError, ShippingRound
from pgplane.compute.local.copies.timeline import temporary_pgdata
from pgplane.compute.local.files import fsync_dir, write_atomic
from pgplane.compute.local.history.archiving import HistoryDirs, list_bases, read_retention
from pgplane.compute.local.history.pitr import rebuild
from pgplane.compute.local.history.wal import segment_bytes
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.records import Running
from pgplane.compute.local.postgres.sessions import ADMIN_USER, connect, conninfo
from pgplane.compute.local.shared import fetching, shipping
from pgplane.compute.local.shared.objects import ObjectStore, off_loop
from pgplane.compute.local.shared.receiver import Streams
from pgplane.compute.local.tenants.cgroups import REPLAY_WORK
from pgplane.compute.local.tenants.projects import ids
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

InstallFor = Callable[..., Awaitable[tuple[PgInstall, RunAs]]]
_SWITCH_TIMEOUT = 10.0
# A segment just switched to holds its page header; more than that is a record written since.
_SEGMENT_HEADER = 64


class Archived(NamedTuple):
    """A branch's archive (None: not known here): when its newest shipped WAL was written
    (epoch us), what its objects take there, and its archived WAL waiting to be shipped (bytes,
    and since when: the oldest's mtime)."""

    at: int | None
    stored: int | None
    waiting: int | None
    waiting_since: int | None


class SharedHistory:
    def __init__(
        self,
        *,
        store: ObjectStore,
        layout: Layout,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        install: InstallFor,
        project_dir: Callable[[str], Awaitable[RunAs]],
        archive_timeout_seconds: int = 0,
        streams: Streams | None = None,
    ) -> None:
        self.store = store
        self._streams = streams
        # Postgres 18's own archive_timeout was seen never to switch here: the rounds do it.
        self._archive_timeout = archive_timeout_seconds
        self._switched: dict[Path, float] = {}
        # The head each branch's last round wrote (this node is its only writer: the project
        # is placed here, and an object store's prefix is leased).
        self._heads: dict[str, shipping.Head] = {}
        # The bytes each branch's objects took there when its last changed round listed them.
        self._stored: dict[str, int] = {}
        # What each branch's last round left here unshipped: the oldest's mtime, and bytes.
        self._waiting: dict[str, tuple[float, int]] = {}
        self._layout = layout
        self._postmasters = postmasters
        self._locks = locks
        self._install = install
        self._project_dir = project_dir
        # Root's, on this node's disk: base states packed on their way out, and back in.
        self._staging = layout.data_dir / "shipping"

    async def ship_all(self, project_ids: Set[str] | None = None) -> ShippingRound:
        """One round over every branch here (of ``project_ids``, when given): new history
        shipped, freed history freed; what it shipped, and what is still only here."""
        files = failed = unshipped = 0
        more = False
        oldest: float | None = None
        for project_id in ids(self._layout.projects):
            if project_ids is not None and project_id not in project_ids:
                continue
            for branch_id in ids(self._layout.project_dir(project_id) / "branches"):
                if self._locks["tenant", project_id].locked():
                    break  # being detached or reattached: its tree is moving
                try:
                    copied, left_over = await self._ship(project_id, branch_id)
                    files += copied
                    more = more or left_over
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # one branch's trouble must not stop the others'
                    failed += 1
                    log.warning("history of %s/%s not shipped: %s", project_id, branch_id, exc)
                left = await asyncio.to_thread(self._left, project_id, branch_id)
                prefix = shipping.prefix_of(project_id, branch_id)
                if left is None:
                    self._waiting.pop(prefix, None)
                else:
                    self._waiting[prefix] = left
                    unshipped += left[1]
                    oldest = left[0] if oldest is None else min(oldest, left[0])
        lag = 0.0 if oldest is None else max(0.0, time.time() - oldest)
        return ShippingRound(
            files=files, failed=failed, lag_seconds=lag, unshipped_bytes=unshipped, more=more
        )

    def _left(self, project_id: str, branch_id: str) -> tuple[float, int] | None:
        """The branch's archived WAL not named in the head its last round wrote: the oldest's
        mtime and their bytes on disk; None when there is none."""
        head = self._heads.get(shipping.prefix_of(project_id, branch_id))
        shipped = {} if head is None else head.wal  # before its first round: none known
        wal = HistoryDirs(self._layout.branch_dir(project_id, branch_id)).wal
        oldest, size = None, 0
        for name in shipping.local_wal(wal):
            if name in shipped:
                continue
            try:
                st = os.lstat(wal / name)  # never through a link: the tenant's directory
            except FileNotFoundError:
                continue
            size += st.st_blocks * 512
            oldest = st.st_mtime if oldest is None else min(oldest, st.st_mtime)
        return None if oldest is None else (oldest, size)

    async def _ship(self, project_id: str, branch_id: str) -> tuple[int, bool]:
        """Files the branch's share of the round shipped, and whether it left some."""
        dirs = HistoryDirs(self._layout.branch_dir(project_id, branch_id))
        running = self._postmasters.running(dirs.pgdata)
        if running is not None and self._archive_timeout > 0:
            await self._complete_segment(dirs.pgdata, running)
        if running is not None and running.endpoint_id is not None:
            await self._stream(project_id, branch_id, running)
        async with self._locks["tenant", project_id]:
            if not (dirs.pgdata / TIMELINE_MARKER).is_file():
                return 0, False  # not built yet, or moving
            prefix = shipping.prefix_of(project_id, branch_id)
            # The head this node last wrote: kept through a failed round, whose new files the
            # next round stores again (a round that failed midway may have stored some).
            done = await off_loop(
                shipping.ship, self.store, dirs, prefix, self._staging, self._heads.get(prefix)
            )
            self._heads[prefix] = done.head
            if done.stored is not None:
                self._stored[prefix] = done.stored
        if done.refused is not None:  # what did ship is in the head; the round counts a failure
            raise done.refused
        return done.copied, done.more

    async def _stream(self, project_id: str, branch_id: str, running: Running) -> None:
        """A compute adopted after a restart, or whose receiver ended, streamed again (unless
        its project keeps no history: its WAL is never shipped, so pieces would never be
        freed). Starting a receiver is quick: it connects on its own thread."""
        if self._streams is None:
            return
        config = self._layout.storage_config(project_id)
        if await asyncio.to_thread(read_retention, config) <= 0:
            return
        info = conninfo(running.socket_dir, running.port, user=ADMIN_USER)
        self._streams.ensure(
            self._layout.pgdata(project_id, branch_id), project_id, branch_id, info
        )

    def archived(self, project_id: str, branch_id: str) -> Archived:
        """The branch's archive as this node's last rounds found it."""
        prefix = shipping.prefix_of(project_id, branch_id)
        head = self._heads.get(prefix)
        oldest, waiting = self._waiting.get(prefix, (None, 0))
        at = head.wal_end_at or None if head else None
        streamed = (
            None
            if self._streams is None
            else self._streams.stored(self._layout.pgdata(project_id, branch_id))
        )
        if streamed is not None:  # what its compute wrote since, stored as it came
            at = max(at or 0, int(streamed[1] * 1e6))
        return Archived(
            at=at,
            stored=self._stored.get(prefix),
            waiting=waiting if head else None,
            waiting_since=None if oldest is None else int(oldest * 1e6),
        )

    async def _complete_segment(self, pgdata: Path, running: Running) -> None:
        """The compute's segment completed (so archived, then shipped) once it holds records
        older than the archive timeout; nothing when nothing was written since the last."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._switched.get(pgdata, 0.0) < self._archive_timeout:
            return
        self._switched[pgdata] = loop.time()
        info = conninfo(running.socket_dir, running.port, user=ADMIN_USER)
        try:
            async with asyncio.timeout(_SWITCH_TIMEOUT):
                conn = await connect(info)
                async with conn:
                    cur = await conn.execute(
                        "SELECT pg_catalog.pg_is_in_recovery(),"
                        " (pg_catalog.pg_current_wal_insert_lsn() OPERATOR(pg_catalog.-)"
                        " '0/0'::pg_catalog.pg_lsn)::pg_catalog.int8,"
                        " pg_catalog.current_setting('wal_segment_size', false)"
                    )
                    row = await cur.fetchone()
                    if row is None or row[0]:
                        return
                    segment = segment_bytes(str(row[2]))
                    if int(row[1]) % segment > _SEGMENT_HEADER:
                        await conn.execute("SELECT pg_catalog.pg_switch_wal()")
        except (psycopg.Error, TimeoutError, OSError, ValueError) as exc:
            log.info("could not complete the WAL segment of %s: %s", pgdata, exc)

    async def rebuild(self, project_id: str, branch_ids: Sequence[str], pg_version: int) -> None:
        """Each branch's data rebuilt here from its shipped history, to its end: converges (a
        branch rebuilt already is left as it is). ComputeError names the branches that could
        not be, once every other one is."""
        lost: list[str] = []
        for branch_id in branch_ids:
            try:
                await self._rebuild(project_id, branch_id, pg_version)
            except ComputeError as exc:
                log.error("branch %s/%s not rebuilt: %s", project_id, branch_id, exc)  # noqa: TRY400 - the reason, not a trace
                lost.append(f"{branch_id} ({exc})")
        if lost:
            raise ComputeError("not rebuilt from shared storage: " + "; ".join(lost))

    async def _rebuild(self, project_id: str, branch_id: str, pg_version: int) -> None:
        # The installation (its template built on a node's first use: half a second) is made
        # ready while the history is fetched, which needs only the project's directory.
        run_as = await self._project_dir(project_id)
        installing = asyncio.ensure_future(self._install(project_id, pg_version))
        try:
            await self._rebuild_with(project_id, branch_id, run_as, installing)
        finally:
            if not installing.done():
                installing.cancel()
            await asyncio.gather(installing, return_exceptions=True)

    async def _rebuild_with(
        self,
        project_id: str,
        branch_id: str,
        run_as: RunAs,
        installing: asyncio.Future[tuple[PgInstall, RunAs]],
    ) -> None:
        dirs = HistoryDirs(self._layout.branch_dir(project_id, branch_id))
        pgdata = dirs.pgdata
        async with self._locks["timeline", pgdata]:
            if (pgdata / TIMELINE_MARKER).is_file():
                return
            await asyncio.to_thread(dirs.branch_dir.mkdir, mode=0o711, exist_ok=True)
            owner = (run_as.uid, run_as.gid) if run_as.switch else (os.geteuid(), os.getegid())
            prefix = shipping.prefix_of(project_id, branch_id)
            self._heads.pop(prefix, None)  # another node may have shipped it since this one
            tmp = temporary_pgdata(pgdata)
            await self._postmasters.stop(tmp)
            await asyncio.to_thread(shutil.rmtree, tmp, True)
            async with self._locks["history", dirs.branch_dir]:
                began = time.perf_counter()
                checked = await asyncio.to_thread(
                    fetching.fetch, self.store, dirs, prefix, self._staging, owner
                )
                log.info(
                    "branch %s/%s: its history fetched in %.0f ms",
                    project_id,
                    branch_id,
                    (time.perf_counter() - began) * 1000,
                )
                base = (await asyncio.to_thread(list_bases, dirs))[-1]
                install, run_as = await installing
                try:
                    await rebuild(
                        install=install,
                        run_as=run_as,
                        postmasters=self._postmasters,
                        source=dirs,
                        base=base,
                        tmp=tmp,
                        socket_dir=self._layout.init_socket_dir(project_id, branch_id),
                        hba_file=self._layout.hba_file,
                        point=None,
                        base_checked=checked,
                        limits=REPLAY_WORK,  # the tenant's WAL
                    )
                except BaseException:
                    await asyncio.shield(self._discard(tmp))
                    raise
            marker = tmp / TIMELINE_MARKER
            await asyncio.to_thread(write_atomic, marker, b"")
            run_as.chown(marker)
            os.replace(tmp, pgdata)
            await asyncio.to_thread(fsync_dir, pgdata.parent)
        log.info("branch %s/%s rebuilt from shared storage", project_id, branch_id)

    async def _discard(self, tmp: Path) -> None:
        await self._postmasters.stop(tmp)
        await asyncio.to_thread(shutil.rmtree, tmp, True)
