"""Endpoint postmasters: the command line, starting one unless it runs, and the temporary
socket-only postmaster that serves platform work on a branch without a running compute.

Every postmaster runs as its project's user, on data that user owns (claimed from an earlier
version's shared user first, when nothing runs on it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, ComputeSpec, PortInUse, RunningCompute
from pgplane.compute.local.copies.timeline import (
    INIT_PORT,
    check_data_version,
    fresh_socket_dir,
    temporary_pgdata,
)
from pgplane.compute.local.history.archiving import (
    HistoryDirs,
    archive_settings,
    prepare_archive,
    read_retention,
)
from pgplane.compute.local.history.pitr import switch_wal
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.command import check_settings, postmaster_argv
from pgplane.compute.local.postgres.limits.size_limit import SizeLimit, config_files
from pgplane.compute.local.postgres.logical import logical_settings, wal_level
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.readiness import wait_ready
from pgplane.compute.local.postgres.records import Running, is_alive
from pgplane.compute.local.postgres.sessions import admin_conninfo
from pgplane.compute.local.postgres.sizing import compute_settings
from pgplane.compute.local.shared.receiver import SLOT_KEEP, STANDBY_NAME, Streams
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.projects import Tenants, ids
from pgplane.compute.local.tenants.sockets import make_socket_dir
from pgplane.compute.local.tenants.user import RunAs
from pgplane.core import ports

log = logging.getLogger(__name__)

# The runnable installation of a major version and the project's user (driver._install).
InstallFor = Callable[[str, int], Awaitable[tuple[PgInstall, RunAs]]]


class Computes:
    """The postmasters of endpoints and of platform work, on this machine."""

    def __init__(
        self,
        *,
        layout: Layout,
        listen_host: str,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        tenants: Tenants,
        install: InstallFor,
        size_limit: SizeLimit | None = None,
        archive_timeout_seconds: int = 0,
        streams: Streams | None = None,
    ) -> None:
        self.layout = layout
        # With an object store: each compute's WAL streamed there (shared/streaming.py).
        self._streams = streams
        self._size_limit = size_limit
        # With shared storage: a written segment completed (so archived, then shipped) at the
        # latest this long after its first record, bounding what a dead node's computes lose.
        self._archive_timeout = archive_timeout_seconds
        self.listen_host = listen_host
        self._postmasters = postmasters
        self._locks = locks
        self._tenants = tenants
        self._install = install

    async def on_branch(
        self,
        project_id: str,
        branch_id: str,
        pg_version: int,
        compute: ComputeSpec | None,
        action: Callable[[Path, int], Awaitable[None]],
        *,
        start: bool,
    ) -> None:
        """Run ``action`` against a postmaster on the branch's data.

        The branch's compute if it runs (started first when ``start``); whatever endpoint serves
        the branch otherwise; failing both, a temporary socket-only postmaster for the time it
        takes.
        """
        pgdata = self.layout.pgdata(project_id, branch_id)
        if compute is not None and start:
            if (compute.project_id, compute.branch_id) != (project_id, branch_id):
                raise ComputeError(f"endpoint {compute.endpoint_id} is not on branch {branch_id}")
            argv, run_as = await self.argv(compute)
            async with self._locks["postmaster", pgdata]:
                await self.ensure_running(compute, argv, run_as)
                await action(self.layout.socket_dir(compute.endpoint_id), compute.port)
            return
        if not (pgdata / TIMELINE_MARKER).is_file():
            raise ComputeError(f"branch {branch_id} of project {project_id} has no data directory")
        check_data_version(pgdata, pg_version)
        install, run_as = await self._install(project_id, pg_version)
        socket_dir = self.layout.init_socket_dir(project_id, branch_id)
        async with self._locks["postmaster", pgdata]:
            current = self._postmasters.running(pgdata)
            if current is not None and current.socket_dir != socket_dir:
                # An endpoint serves the branch: act there (where the platform started it).
                await action(current.socket_dir, current.port)
                return
            # Nothing serves the branch (or only the temporary postmaster of a crashed attempt).
            await self._postmasters.stop(pgdata)
            await self._tenants.claim(pgdata, run_as)
            await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
            argv = postmaster_argv(
                install,
                pgdata,
                port=INIT_PORT,
                socket_dir=socket_dir,
                listen="",
                # What the platform writes is history too (roles it changes, say).
                settings=await self.history_settings(project_id, branch_id, run_as),
                hba_file=self.layout.hba_file,
            )
            log_path = pgdata.parent / "apply_config.log"
            await self._postmasters.start(
                argv,
                pgdata=pgdata,
                port=INIT_PORT,
                socket_dir=socket_dir,
                run_as=run_as,
                log_path=log_path,
            )
            try:
                # Killed here, the temporary postmaster is left running: the next use of the
                # data (a start, a check, a change) stops it first, as above.
                await failpoints.reached("offline_postmaster:ready")
                await action(socket_dir, INIT_PORT)
            finally:
                await self.stop_archived(pgdata)
                await asyncio.to_thread(shutil.rmtree, socket_dir, True)

    async def argv(self, spec: ComputeSpec) -> tuple[list[str], RunAs]:
        """The endpoint's postmaster command line, after checking what it names."""
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        socket_dir = self.layout.socket_dir(spec.endpoint_id)
        settings = compute_settings(spec.autoscaling_limit_max_cu, check_settings(spec.pg_settings))
        if not (pgdata / TIMELINE_MARKER).is_file():
            raise ComputeError(
                f"branch {spec.branch_id} of project {spec.project_id} has no data directory"
            )
        check_data_version(pgdata, spec.pg_version)
        install, run_as = await self._install(spec.project_id, spec.pg_version)
        history = await self.history_settings(spec.project_id, spec.branch_id, run_as)
        settings |= history
        if history and self._streams is not None:
            # The receiver's slot holds WAL it has not taken yet; a stalled one, this much
            # at most (past it the slot is dropped, and the WAL goes as without one).
            settings["max_slot_wal_keep_size"] = SLOT_KEEP
            if self._streams.synchronous:
                # A commit waits for the platform's receiver to have stored its WAL.
                settings["synchronous_standby_names"] = STANDBY_NAME
        if spec.logical_replication:
            # Its slots' bounds (for the receiver's slot too: the setting is one for all).
            settings |= logical_settings(spec.pg_version)
        if self._size_limit is not None:
            library = await self._size_limit.library(spec.pg_version)
            if library is not None:
                settings = await self._size_limit.settings(
                    library, spec.project_id, spec.branch_id, settings
                )
        argv = postmaster_argv(
            install,
            pgdata,
            port=spec.port,
            socket_dir=socket_dir,
            # In a sandbox of its own the network is its own: only its unix socket is reached.
            listen="" if self._postmasters.walls.sandboxed(run_as) else self.listen_host,
            settings=settings,
            hba_file=self.layout.hba_file,
            # Its replicas' WAL streams come from there (compute/local/replicas/).
            more_socket_dirs=[self.layout.wal_socket_dir(spec.project_id, spec.branch_id)],
            wal_level=wal_level(spec),
        )
        return argv, run_as

    async def history_settings(
        self, project_id: str, branch_id: str, run_as: RunAs
    ) -> dict[str, str]:
        """Archiving into the branch's history, unless its project keeps none (see history.py)."""
        retention = await asyncio.to_thread(read_retention, self.layout.storage_config(project_id))
        if retention <= 0:
            return {}
        dirs = HistoryDirs(self.layout.branch_dir(project_id, branch_id))
        await asyncio.to_thread(prepare_archive, dirs, run_as)
        settings = archive_settings(dirs.wal)
        if self._archive_timeout > 0:
            settings["archive_timeout"] = f"{self._archive_timeout}s"
        return settings

    async def stop_archived(self, pgdata: Path, *, signalled: str | None = None) -> None:
        """Stop the postmaster on ``pgdata`` with nothing left unarchived: its current segment
        is completed first, and Postgres archives every completed one before it exits."""
        current = self._postmasters.running(pgdata)
        # Not asked of a compute its tenant stopped (it would time out): it is killed, and
        # the segment it was writing is archived when it next runs.
        if current is not None and not await self._postmasters.halted(current):
            await switch_wal(current)
        await self._postmasters.stop(pgdata, signalled=signalled)

    async def ensure_running(self, spec: ComputeSpec, argv: list[str], run_as: RunAs) -> None:
        """Start the endpoint's postmaster unless it runs as ``argv``; the caller holds the lock."""
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        socket_dir = self.layout.socket_dir(spec.endpoint_id)
        log_path = self.layout.log_path(spec.project_id, spec.branch_id, spec.endpoint_id)
        current = self._postmasters.running(pgdata)
        if current is not None and current.sandboxed and current.postmaster() is None:
            # Its postmaster died (killed, say) and its sandbox is ending with it: its pid file
            # and socket still say "ready". Let it end, then start afresh.
            await self._postmasters.stop(pgdata)
            current = None
        if current is not None:
            if serves(current, argv, spec.port, socket_dir):
                await self._postmasters.resize(pgdata, limits_for(spec, argv))
                await wait_ready(
                    pgdata,
                    socket_dir,
                    spec.port,
                    alive=lambda: is_alive(current) and current.postmaster() is not None,
                    log_path=log_path,
                )
                await self.stream(spec.project_id, spec.branch_id, current)
                return
            log.info("restarting the postmaster of %s: its command line changed", pgdata)
            await self._postmasters.stop(pgdata, signalled="restart_compute:signalled")
        await self._tenants.claim(pgdata, run_as)
        await asyncio.to_thread(self.prepare_endpoint, spec.project_id, spec.endpoint_id, run_as)
        wal_sockets = self.layout.wal_socket_dir(spec.project_id, spec.branch_id)
        await asyncio.to_thread(self.make_wal_socket_dir, wal_sockets, run_as)
        # Checked first: Postgres would only say so in its log, after its start-up. A sandboxed
        # compute listens on no port of the machine (its network is its own): nothing to check.
        sandboxed = self._postmasters.walls.sandboxed(run_as)
        if not sandboxed and not await asyncio.to_thread(
            ports.is_free, spec.port, self.listen_host
        ):
            raise PortInUse(spec.port)
        await self._postmasters.start(
            argv,
            pgdata=pgdata,
            port=spec.port,
            socket_dir=socket_dir,
            run_as=run_as,
            log_path=log_path,
            spawned="start_compute:spawned",
            endpoint_id=spec.endpoint_id,
            readable=config_files(argv),
            limits=limits_for(spec, argv),
            writable=[wal_sockets],
        )
        started = self._postmasters.running(pgdata)
        if started is not None:
            await self.stream(spec.project_id, spec.branch_id, started)

    async def stream(self, project_id: str, branch_id: str, running: Running) -> None:
        """With an object store, the endpoint's WAL streamed there from now on (unless its
        project keeps no history); in synchronous mode its commits wait for this."""
        if self._streams is None or running.endpoint_id is None:
            return
        retention = await asyncio.to_thread(read_retention, self.layout.storage_config(project_id))
        if retention <= 0:
            return
        pgdata = self.layout.pgdata(project_id, branch_id)
        info = admin_conninfo(running.socket_dir, running.port)
        self._streams.ensure(pgdata, project_id, branch_id, info)

    def reload_configuration(self) -> int:
        """SIGHUP to each running endpoint postmaster that reads a configuration file of the
        platform's (``pg_ctl reload``): a changed size limit applies without a restart.
        Returns how many were signalled."""
        signalled = 0
        for project_id in ids(self.layout.projects):
            for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
                current = self._postmasters.running(self.layout.pgdata(project_id, branch_id))
                pid = current.postmaster() if current is not None else None
                if pid is None or current is None or not config_files(current.argv):
                    continue
                try:
                    os.kill(pid, signal.SIGHUP)
                except OSError as exc:  # gone meanwhile; it reads the file at its next start
                    log.warning("could not reload the postmaster of %s: %s", branch_id, exc)
                    continue
                signalled += 1
        return signalled

    async def adopt_running(self) -> list[RunningCompute]:
        """The computes running here; those an earlier serve started are autoscaled again."""
        found, records = await asyncio.to_thread(self.running_computes)
        for record in records:
            self._postmasters.watch_adopted(record)
        return found

    def running_computes(self) -> tuple[list[RunningCompute], list[Running]]:
        """The computes running here, and the records of the endpoints' among them."""
        found, adopted = [], []
        for project_id in ids(self.layout.projects):
            for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
                pgdata = self.layout.pgdata(project_id, branch_id)
                for data_dir in (pgdata, temporary_pgdata(pgdata)):
                    current = self._postmasters.running(data_dir)
                    if current is None:
                        continue
                    endpoint_id = current.endpoint_id if data_dir == pgdata else None
                    found.append(RunningCompute(project_id, branch_id, endpoint_id))
                    if endpoint_id is not None:
                        adopted.append(current)
        return found, adopted

    def make_wal_socket_dir(self, path: Path, run_as: RunAs) -> None:
        """The branch's replication socket directory, kept for the branch's life (blocking)."""
        make_socket_dir(path, run_as, own_filesystem=self._tenants.volumes.active)

    def prepare_endpoint(self, project_id: str, endpoint_id: str, run_as: RunAs) -> None:
        # Recorded so delete_tenant finds the endpoint's socket directory and log.
        records = ensure_dir(self.layout.endpoint_records(project_id), 0o700)
        (records / endpoint_id).touch()
        socket_dir = self.layout.socket_dir(endpoint_id)
        make_socket_dir(socket_dir, run_as, own_filesystem=self._tenants.volumes.active)


def serves(current: Running, argv: Sequence[str], port: int, socket_dir: Path) -> bool:
    """Whether the running postmaster is the one we would start (same port, socket, settings),
    as the platform recorded its command line (the binary's path may differ: a relocated copy)."""
    if current.port != port or current.socket_dir != socket_dir:
        return False
    return list(current.argv[1:]) == list(argv[1:])


def limits_for(spec: ComputeSpec, argv: Sequence[str]) -> Limits:
    """The cgroup of an endpoint of ``autoscaling_limit_max_cu``, with room for the
    connections its command line allows (the size's, or the endpoint's own setting)."""
    connections = 0
    for arg in argv:
        name, _, value = arg.partition("=")
        if name.lower() == "max_connections" and value.isdigit():
            connections = int(value)
    return Limits.for_size(
        spec.autoscaling_limit_max_cu, connections, spec.autoscaling_limit_min_cu
    )
