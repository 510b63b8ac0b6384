"""Read-only computes: each a hot standby on a copy of its branch's data, of its own.

::

    branches/<branch_id>/replicas/<endpoint_id>/           root's, 0711 (the sandbox's
                                                           writable mount)
    branches/<branch_id>/replicas/<endpoint_id>/pgdata/    the standby's data, the project
                                                           user's

A replica's data is a cache of its branch's: made afresh at each start (the copy machinery's
online copy of a running primary, or a file copy of a stopped one, plus ``standby.signal``) and
removed at each stop, so a suspended replica holds no disk, a branch restored meanwhile is
followed from its new data, and deleting the endpoint or the branch leaves nothing behind. Its
postmaster runs as the project's user, sandboxed and in a cgroup of its size like any compute,
and writes nothing of the branch's: its archive is mounted read-only, the primary's socket is
reached through the branch's replication socket directory (:mod:`.standby`).

A start killed half-way leaves either a partial copy (``pgdata.tmp``, removed by the next
attempt) or a whole one with no postmaster, which the next attempt replaces: nothing of a
replica is trusted from an earlier run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, ComputeSpec, PortInUse, RunningCompute
from pgplane.compute.local.copies.branch import build_branch
from pgplane.compute.local.copies.timeline import check_data_version, temporary_pgdata
from pgplane.compute.local.files import remove_tree
from pgplane.compute.local.history.archiving import HistoryDirs, read_retention
from pgplane.compute.local.layout import TIMELINE_MARKER, Layout, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.command import check_settings, postmaster_argv
from pgplane.compute.local.postgres.computes import Computes, limits_for, serves
from pgplane.compute.local.postgres.logical import wal_level
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.readiness import wait_ready
from pgplane.compute.local.postgres.records import Running, is_alive
from pgplane.compute.local.postgres.sizing import compute_settings
from pgplane.compute.local.replicas.standby import (
    MINIMA,
    primary_minima,
    raised,
    standby_settings,
)
from pgplane.compute.local.tenants.projects import Tenants, ids
from pgplane.compute.local.tenants.sockets import remove_socket_dir
from pgplane.compute.local.tenants.user import RunAs
from pgplane.core import ports

log = logging.getLogger(__name__)

InstallFor = Callable[[str, int], Awaitable[tuple[PgInstall, RunAs]]]
STANDBY_SIGNAL = "standby.signal"


class Replicas:
    def __init__(
        self,
        *,
        layout: Layout,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        tenants: Tenants,
        computes: Computes,
        install: InstallFor,
        disk_reserve_bytes: int | None,
    ) -> None:
        self.layout = layout
        self._postmasters = postmasters
        self._locks = locks
        self._tenants = tenants
        self._computes = computes
        self._install = install
        self._reserve = disk_reserve_bytes

    def running(self, project_id: str, branch_id: str, endpoint_id: str) -> Running | None:
        """The endpoint's standby postmaster, when one runs."""
        current = self._postmasters.running(
            self.layout.replica_pgdata(project_id, branch_id, endpoint_id)
        )
        if current is None or current.socket_dir != self.layout.socket_dir(endpoint_id):
            return None
        return current

    def is_replica(self, project_id: str, branch_id: str, endpoint_id: str) -> bool:
        """Whether the endpoint's compute is a replica here: its directory is made before
        anything of it runs, and removed after it stopped."""
        pgdata = self.layout.replica_pgdata(project_id, branch_id, endpoint_id)
        return pgdata.parent.is_dir()

    async def start(self, spec: ComputeSpec) -> None:
        """Run the endpoint's standby unless it runs as it should; rebuilt from its branch."""
        project_id, branch_id, endpoint_id = spec.project_id, spec.branch_id, spec.endpoint_id
        branch_pgdata = self.layout.pgdata(project_id, branch_id)
        pgdata = self.layout.replica_pgdata(project_id, branch_id, endpoint_id)
        if not (branch_pgdata / TIMELINE_MARKER).is_file():
            raise ComputeError(f"branch {branch_id} of project {project_id} has no data directory")
        check_data_version(branch_pgdata, spec.pg_version)
        install, run_as = await self._install(project_id, spec.pg_version)
        async with self._locks["postmaster", pgdata]:
            current = self._postmasters.running(pgdata)
            if current is not None and current.sandboxed and current.postmaster() is None:
                await self._postmasters.stop(pgdata)  # died; its sandbox is ending with it
                current = None
            if current is not None:
                argv = await self._argv(spec, install, run_as, _minima_of(current.argv))
                if serves(current, argv, spec.port, self.layout.socket_dir(endpoint_id)):
                    await self._postmasters.resize(pgdata, limits_for(spec, argv))
                    await wait_ready(
                        pgdata,
                        current.socket_dir,
                        spec.port,
                        alive=lambda: is_alive(current) and current.postmaster() is not None,
                        log_path=self._log(spec),
                    )
                    return
                log.info("restarting the replica %s: its command line changed", endpoint_id)
                await self._postmasters.stop(pgdata, signalled="restart_compute:signalled")
            await self._build(spec, install, run_as, pgdata)
            # Killed here: a whole copy and no postmaster; the next start copies afresh.
            await failpoints.reached("start_replica:copied")
            minima = await primary_minima(install, run_as, pgdata)
            argv = await self._argv(spec, install, run_as, minima)
            await asyncio.to_thread(
                self._computes.prepare_endpoint, project_id, endpoint_id, run_as
            )
            wal_sockets = self.layout.wal_socket_dir(project_id, branch_id)
            await asyncio.to_thread(self._computes.make_wal_socket_dir, wal_sockets, run_as)
            archive = await self._archive(project_id, branch_id)
            sandboxed = self._postmasters.walls.sandboxed(run_as)
            host = self._computes.listen_host
            if not sandboxed and not await asyncio.to_thread(ports.is_free, spec.port, host):
                raise PortInUse(spec.port)
            await self._postmasters.start(
                argv,
                pgdata=pgdata,
                port=spec.port,
                socket_dir=self.layout.socket_dir(endpoint_id),
                run_as=run_as,
                log_path=self._log(spec),
                spawned="start_compute:spawned",
                endpoint_id=endpoint_id,
                readable=[wal_sockets, *([archive] if archive is not None else [])],
                limits=limits_for(spec, argv),
            )

    async def stop(self, project_id: str, branch_id: str, endpoint_id: str) -> None:
        """Stop the endpoint's standby and remove its data; no-op when there is none."""
        pgdata = self.layout.replica_pgdata(project_id, branch_id, endpoint_id)
        async with self._locks["postmaster", pgdata]:
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                await self._postmasters.stop(data_dir, signalled="stop_compute:signalled")
            await remove_tree(pgdata.parent)
        await asyncio.to_thread(remove_socket_dir, self.layout.socket_dir(endpoint_id))

    async def stop_branch(self, project_id: str, branch_id: str) -> None:
        """Every standby of the branch stopped and its data removed (a branch going, say)."""
        for endpoint_id in ids(self.layout.replicas_dir(project_id, branch_id)):
            await self.stop(project_id, branch_id, endpoint_id)

    async def stop_project(self, project_id: str) -> None:
        for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
            await self.stop_branch(project_id, branch_id)

    async def adopt_running(self) -> list[RunningCompute]:
        """The standbys running here; those an earlier serve started are autoscaled again."""
        found, records = await asyncio.to_thread(self.running_computes)
        for record in records:
            self._postmasters.watch_adopted(record)
        return found

    def running_computes(self) -> tuple[list[RunningCompute], list[Running]]:
        """The standbys running here, and their records."""
        found, records = [], []
        for project_id in ids(self.layout.projects):
            for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
                for endpoint_id in ids(self.layout.replicas_dir(project_id, branch_id)):
                    current = self.running(project_id, branch_id, endpoint_id)
                    if current is not None and current.endpoint_id == endpoint_id:
                        found.append(RunningCompute(project_id, branch_id, endpoint_id))
                        records.append(current)
        return found, records

    async def _build(
        self, spec: ComputeSpec, install: PgInstall, run_as: RunAs, pgdata: Path
    ) -> None:
        """A fresh standby copy of the branch's data at ``pgdata`` (any earlier one removed)."""
        project_id, branch_id = spec.project_id, spec.branch_id
        branch_pgdata = self.layout.pgdata(project_id, branch_id)
        await asyncio.to_thread(ensure_dir, self.layout.replicas_dir(project_id, branch_id))
        await asyncio.to_thread(ensure_dir, pgdata.parent)
        await remove_tree(pgdata)
        async with self._locks["postmaster", branch_pgdata]:
            if self._postmasters.running(branch_pgdata) is None:
                await self._tenants.claim(branch_pgdata, run_as)  # read as run_as when stopped
            await build_branch(
                install=install,
                run_as=run_as,
                postmasters=self._postmasters,
                parent=branch_pgdata,
                pgdata=pgdata,
                label=f"pgplane replica {project_id}/{spec.endpoint_id}",
                disk_reserve_bytes=self._reserve,
                extra_files={STANDBY_SIGNAL: b""},
            )

    async def _argv(
        self, spec: ComputeSpec, install: PgInstall, run_as: RunAs, minima: dict[str, int]
    ) -> list[str]:
        pgdata = self.layout.replica_pgdata(spec.project_id, spec.branch_id, spec.endpoint_id)
        settings = compute_settings(spec.autoscaling_limit_max_cu, check_settings(spec.pg_settings))
        settings = raised(settings, minima)
        settings |= standby_settings(
            endpoint_id=spec.endpoint_id,
            wal_sockets=self.layout.wal_socket_dir(spec.project_id, spec.branch_id),
            primary_port=spec.primary_port,
            archive=await self._archive(spec.project_id, spec.branch_id),
        )
        return postmaster_argv(
            install,
            pgdata,
            port=spec.port,
            socket_dir=self.layout.socket_dir(spec.endpoint_id),
            listen="" if self._postmasters.walls.sandboxed(run_as) else self._computes.listen_host,
            settings=settings,
            hba_file=self.layout.hba_file,
            # Its copy holds the primary's logical slots, if any: Postgres needs logical then.
            wal_level=wal_level(spec),
        )

    async def _archive(self, project_id: str, branch_id: str) -> Path | None:
        """The branch's WAL archive, when its project keeps history (and so one is written)."""
        retention = await asyncio.to_thread(read_retention, self.layout.storage_config(project_id))
        wal = HistoryDirs(self.layout.branch_dir(project_id, branch_id)).wal
        return wal if retention > 0 and wal.is_dir() else None

    def _log(self, spec: ComputeSpec) -> Path:
        return self.layout.log_path(spec.project_id, spec.branch_id, spec.endpoint_id)


def _minima_of(argv: tuple[str, ...]) -> dict[str, int]:
    """The raised settings a running standby was started with (to compare its command line)."""
    found = {}
    for arg in argv:
        name, _, value = arg.partition("=")
        if name in MINIMA and value.isdigit():
            found[name] = int(value)
    return found
