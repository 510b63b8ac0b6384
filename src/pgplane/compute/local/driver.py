"""The local compute driver: the ComputeDriver contract on this machine, kept thin.

Each method validates ids (the only way they become paths), takes the lock of what it changes,
and delegates: installations and templates (installs), projects' users, directories and
archives (tenants, users), timeline and branch building, postmasters.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path

from pgplane.compute.driver import (
    BranchStorage,
    ComputeAddress,
    ComputeError,
    ComputeSpec,
    ComputeUsage,
    ConfigChange,
    DatabaseSpec,
    HistoryBounds,
    Point,
    RoleSpec,
    RunningCompute,
)
from pgplane.compute.local.config import LocalDriverConfig
from pgplane.compute.local.copies.copies import Copies
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.copies.timeline import build_timeline, completed
from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.history.histories import Histories
from pgplane.compute.local.history.point_reads import PointReads
from pgplane.compute.local.layout import Layout, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.catalog import apply_change, check_change
from pgplane.compute.local.postgres.computes import Computes
from pgplane.compute.local.postgres.installs import Installs
from pgplane.compute.local.postgres.limits.size_limit import SizeLimit
from pgplane.compute.local.postgres.monitor import check_readable, last_client_activity
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.verifiers import read_verifiers
from pgplane.compute.local.replicas.replicas import Replicas
from pgplane.compute.local.schemaonly.branches import SchemaOnly
from pgplane.compute.local.skeleton import Skeleton
from pgplane.compute.local.snapshots.snapshots import Snapshots
from pgplane.compute.local.storage import branch_storage
from pgplane.compute.local.tenants.projects import Tenants, ids
from pgplane.compute.local.tenants.sockets import remove_socket_dir
from pgplane.compute.local.tenants.user import RunAs
from pgplane.compute.local.tenants.users import ComputeUsers
from pgplane.compute.local.tenants.volumes import Volumes
from pgplane.compute.local.tenants.walls import Walls
from pgplane.compute.snapshots import SnapshotMade

log = logging.getLogger(__name__)


class LocalComputeDriver:
    """Postmasters on this machine, one per endpoint, their data under ``config.data_dir``."""

    def __init__(self, config: LocalDriverConfig) -> None:
        self._config = config
        self.layout = Layout(config.data_dir.resolve())
        readable = [self.layout.hba_file, *SizeLimit.readable(self.layout)]  # by every sandbox
        walls = Walls.find(self.layout.sandbox_etc, readable, enabled=config.walls)
        self._postmasters = Postmasters(self.layout.postmaster_records, walls)
        self._locks: defaultdict[tuple[object, ...], asyncio.Lock] = defaultdict(asyncio.Lock)
        self.users = ComputeUsers(config.compute_user)
        self._installs = Installs(
            self.layout,
            config.pg_bin_dirs,
            bundled_only=config.bundled_only,
            shared_user=self._prepare,
        )
        self.volumes = Volumes.find(
            self.layout.volumes, size_bytes=config.disk_per_project_bytes, enabled=config.walls
        )
        self._tenants = Tenants(
            self.layout, self.users, self._postmasters, self._locks, self.volumes
        )
        self._size_limit = SizeLimit(
            self.layout,
            config.branch_size_limit_mib,
            {major: self._installs.found(major) for major in self._installs.versions()},
        )
        self._computes = Computes(
            layout=self.layout,
            listen_host=config.listen_host,
            postmasters=self._postmasters,
            locks=self._locks,
            tenants=self._tenants,
            install=self._install,
            size_limit=self._size_limit,
        )
        self._replicas = Replicas(
            layout=self.layout,
            postmasters=self._postmasters,
            locks=self._locks,
            tenants=self._tenants,
            computes=self._computes,
            install=self._install,
            disk_reserve_bytes=config.disk_reserve_bytes,
        )
        self._spares = SparePool(self.layout.spares)
        if self.volumes.active:
            # Its spares are renamed into place: they cannot cross into a project's filesystem.
            self._spares.disable()
        self._histories = Histories(
            layout=self.layout,
            postmasters=self._postmasters,
            locks=self._locks,
            computes=self._computes,
            install=self._install,
            spares=self._spares,
            base_bytes=config.history_base_bytes,
            disk_reserve_bytes=config.disk_reserve_bytes,
        )
        self._reads = PointReads(
            self._histories, self._computes, self._postmasters, self._locks, self._install
        )
        self._schema_only = SchemaOnly(
            histories=self._histories,
            computes=self._computes,
            reads=self._reads,
            postmasters=self._postmasters,
            locks=self._locks,
            install=self._install,
            template=self._installs.template,
            template_owner=self.users.shared,
        )
        self._skeleton = Skeleton(
            layout=self.layout,
            users=self.users,
            spares=self._spares,
            volumes=self.volumes,
            size_limit=self._size_limit,
        )
        self._copies = Copies(
            layout=self.layout,
            postmasters=self._postmasters,
            locks=self._locks,
            tenants=self._tenants,
            histories=self._histories,
            spares=self._spares,
            install=self._install,
            disk_reserve_bytes=config.disk_reserve_bytes,
        )
        self._snapshots = Snapshots(
            layout=self.layout,
            postmasters=self._postmasters,
            locks=self._locks,
            copies=self._copies,
            histories=self._histories,
            install=self._install,
        )

    @property
    def spares(self) -> SparePool:
        return self._spares

    def pg_versions(self) -> Sequence[int]:
        return self._installs.versions()

    def installation(self, pg_version: int) -> PgInstall:
        """The installation found for a major version (before any relocation)."""
        return self._installs.found(pg_version)

    async def runnable_installation(self, pg_version: int) -> PgInstall:
        """The installation as compute users run it (relocated if it had to be)."""
        await self._prepare()
        return await self._installs.runnable(pg_version)

    async def project_user(self, project_id: str) -> RunAs:
        """The OS user of the project's computes (created on first use when root)."""
        await self._prepare()
        return await self._tenants.user(project_id)

    def pgdata(self, project_id: str, branch_id: str) -> Path:
        return self.layout.pgdata(project_id, branch_id)

    def socket_dir(self, endpoint_id: str) -> Path:
        """Where the endpoint's postmaster puts its unix socket (``.s.PGSQL.<port>``)."""
        return self.layout.socket_dir(endpoint_id)

    def log_path(self, *, project_id: str, branch_id: str, endpoint_id: str) -> Path:
        return self.layout.log_path(project_id, branch_id, endpoint_id)

    async def create_timeline(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        roles: Sequence[RoleSpec],
        databases: Sequence[DatabaseSpec],
    ) -> None:
        pgdata = self.layout.pgdata(project_id, branch_id)
        socket_dir = self.layout.init_socket_dir(project_id, branch_id)
        self.installation(pg_version)
        async with self._locks["timeline", pgdata]:
            if completed(pgdata, pg_version):
                return
            install, run_as = await self._install(project_id, pg_version, make_dir=True)
            await asyncio.to_thread(ensure_dir, pgdata.parent)
            template = self._installs.template(pg_version)
            # Archived from its first write: its history starts with the template it copies.
            archiving = await self._computes.history_settings(project_id, branch_id, run_as)
            await build_timeline(
                install=install,
                run_as=run_as,
                postmasters=self._postmasters,
                template=template,
                pgdata=pgdata,
                socket_dir=socket_dir,
                hba_file=self.layout.hba_file,
                roles=roles,
                databases=databases,
                settings=archiving,
            )
            if archiving:
                await self._histories.take_first_base(
                    project_id, branch_id, install, template, await self.users.shared()
                )

    async def create_branch(
        self,
        *,
        project_id: str,
        parent_branch_id: str,
        branch_id: str,
        pg_version: int,
        point: Point | None = None,
    ) -> int | None:
        parent = self.layout.pgdata(project_id, parent_branch_id)
        pgdata = self.layout.pgdata(project_id, branch_id)
        self.installation(pg_version)
        if parent == pgdata:
            raise ComputeError(f"branch {branch_id} cannot be its own parent")
        async with self._locks["timeline", pgdata]:
            if completed(pgdata, pg_version):
                return None
            lsn = await self._copies.build(project_id, parent_branch_id, pgdata, pg_version, point)
        self._histories.soon(project_id, branch_id)
        return lsn

    async def create_schema_only_branch(
        self,
        *,
        project_id: str,
        source_branch_id: str,
        branch_id: str,
        pg_version: int,
        point: Point | None,
        max_bytes: int,
        roles: Sequence[RoleSpec] = (),
        databases: Sequence[DatabaseSpec] = (),
    ) -> Mapping[str, str]:
        self.installation(pg_version)
        if source_branch_id == branch_id:
            raise ComputeError(f"branch {branch_id} cannot be its own source")
        return await self._schema_only.create(
            project_id=project_id,
            source_branch_id=source_branch_id,
            branch_id=branch_id,
            pg_version=pg_version,
            point=point,
            max_bytes=max_bytes,
            config=ConfigChange(roles=roles, databases=databases),
        )

    async def restore_branch(
        self,
        *,
        project_id: str,
        branch_id: str,
        source_branch_id: str,
        pg_version: int,
        point: Point | None,
        preserve_branch_id: str | None,
        restore_id: str,
    ) -> int | None:
        self.installation(pg_version)
        # Its replicas follow the data being replaced: stopped, copied anew as they start.
        await self._replicas.stop_branch(project_id, branch_id)
        return await self._copies.restore(
            project_id=project_id,
            branch_id=branch_id,
            source_branch_id=source_branch_id,
            pg_version=pg_version,
            point=point,
            preserve_branch_id=preserve_branch_id,
            restore_id=restore_id,
        )

    async def history_bounds(
        self, *, project_id: str, branch_id: str, pg_version: int
    ) -> HistoryBounds:
        self.installation(pg_version)
        return await self._histories.bounds(project_id, branch_id, pg_version)

    async def create_snapshot(
        self,
        *,
        project_id: str,
        branch_id: str,
        snapshot_id: str,
        pg_version: int,
        point: Point | None,
    ) -> SnapshotMade:
        self.installation(pg_version)
        lsn, size = await self._snapshots.create(
            project_id=project_id,
            branch_id=branch_id,
            snapshot_id=snapshot_id,
            pg_version=pg_version,
            point=point,
        )
        return SnapshotMade(lsn=lsn, bytes=size)

    async def delete_snapshot(self, *, project_id: str, snapshot_id: str) -> None:
        await self._snapshots.remove(project_id=project_id, snapshot_id=snapshot_id)

    async def branch_from_snapshot(
        self, *, project_id: str, snapshot_id: str, branch_id: str, pg_version: int
    ) -> None:
        self.installation(pg_version)
        await self._snapshots.to_branch(
            project_id=project_id,
            snapshot_id=snapshot_id,
            branch_id=branch_id,
            pg_version=pg_version,
        )

    async def restore_snapshot(
        self,
        *,
        project_id: str,
        snapshot_id: str,
        branch_id: str,
        pg_version: int,
        preserve_branch_id: str | None,
        restore_id: str,
    ) -> None:
        self.installation(pg_version)
        await self._snapshots.onto_branch(
            project_id=project_id,
            snapshot_id=snapshot_id,
            branch_id=branch_id,
            pg_version=pg_version,
            restore_id=restore_id,
            preserve_branch_id=preserve_branch_id,
        )

    async def apply_size_limit(self) -> None:
        """At start-up: build the size-limit libraries, give running computes the limit."""
        await self._size_limit.apply(self._computes.reload_configuration)

    async def keep_history(self) -> None:
        await self._prepare()
        await self._histories.keep()
        await self._reads.sweep()

    async def delete_timeline(self, *, project_id: str, branch_id: str) -> None:
        await self._replicas.stop_branch(project_id, branch_id)
        await self._tenants.delete_branch(project_id, branch_id)

    async def apply_config(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        compute: ComputeSpec | None,
        change: ConfigChange,
    ) -> None:
        check_change(change)

        async def apply(socket_dir: Path, port: int) -> None:
            await apply_change(socket_dir, port, change)

        self.installation(pg_version)
        await self._computes.on_branch(
            project_id, branch_id, pg_version, compute, apply, start=True
        )

    async def check_availability(
        self, *, project_id: str, branch_id: str, pg_version: int, compute: ComputeSpec | None
    ) -> None:
        # A running compute is checked as it is, never restarted: the check must not disturb.
        self.installation(pg_version)
        await self._computes.on_branch(
            project_id, branch_id, pg_version, compute, check_readable, start=False
        )

    async def dump_schema(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        db_name: str,
        max_bytes: int,
        point: Point | None = None,
    ) -> str:
        return await self._reads.dump_schema(
            project_id, branch_id, pg_version, db_name, max_bytes=max_bytes, point=point
        )

    async def last_activity(self, spec: ComputeSpec) -> float | None:
        if not await self.is_compute_running(
            project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
        ):
            return None
        return await last_client_activity(self.layout.socket_dir(spec.endpoint_id), spec.port)

    async def compute_usage(
        self, *, project_id: str, branch_id: str, endpoint_id: str
    ) -> Sequence[ComputeUsage]:
        replica = self.layout.replica_pgdata(project_id, branch_id, endpoint_id)
        runs = await self._postmasters.runs(replica, endpoint_id)
        pgdata = self.layout.pgdata(project_id, branch_id)
        return runs + await self._postmasters.runs(pgdata, endpoint_id)

    async def branch_storage(
        self, *, project_id: str, branch_id: str, walk: bool = True
    ) -> BranchStorage:
        dirs = self._histories.dirs(project_id, branch_id)
        return await branch_storage(dirs, self._postmasters.running(dirs.pgdata), walk=walk)

    async def login_roles(
        self, spec: ComputeSpec, *, names: Sequence[str] | None = None
    ) -> Mapping[str, str] | None:
        if not await self.is_compute_running(
            project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
        ):
            return None
        return await read_verifiers(self.layout.socket_dir(spec.endpoint_id), spec.port, names)

    async def check_settings(self, *, pg_version: int, settings: Mapping[str, str]) -> None:
        await self._prepare()
        await self._installs.check_settings(pg_version, settings)

    async def start_compute(self, spec: ComputeSpec) -> None:
        self.installation(spec.pg_version)
        if spec.read_only:
            await self._replicas.start(spec)
            return
        argv, run_as = await self._computes.argv(spec)
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        async with self._locks["postmaster", pgdata]:
            await self._computes.ensure_running(spec, argv, run_as)

    def compute_address(self, *, endpoint_id: str, port: int) -> ComputeAddress:
        socket = self.layout.socket_dir(endpoint_id) / f".s.PGSQL.{port}"
        return ComputeAddress(host=self._config.listen_host, port=port, unix_socket=str(socket))

    async def stop_compute(self, *, project_id: str, branch_id: str, endpoint_id: str) -> None:
        if self._replicas.is_replica(project_id, branch_id, endpoint_id):
            await self._replicas.stop(project_id, branch_id, endpoint_id)
            return
        pgdata = self.layout.pgdata(project_id, branch_id)
        socket_dir = self.layout.socket_dir(endpoint_id)
        async with self._locks["postmaster", pgdata]:
            current = self._postmasters.running(pgdata)
            # Another endpoint's (the branch's read-write compute, a read-only one is stopped):
            # left running.
            if current is None or current.endpoint_id in (None, endpoint_id):
                await self._computes.stop_archived(pgdata, signalled="stop_compute:signalled")
        await asyncio.to_thread(remove_socket_dir, socket_dir)

    async def is_compute_running(
        self, *, project_id: str, branch_id: str, endpoint_id: str
    ) -> bool:
        pgdata = self.layout.pgdata(project_id, branch_id)
        socket_dir = self.layout.socket_dir(endpoint_id)
        current = self._postmasters.running(pgdata)
        if current is not None and current.socket_dir == socket_dir:
            return True
        return self._replicas.running(project_id, branch_id, endpoint_id) is not None

    async def running_computes(self) -> Sequence[RunningCompute]:
        found = list(await self._computes.adopt_running())
        return found + await self._replicas.adopt_running()

    async def apply_storage_config(
        self, *, project_id: str, history_retention_seconds: int
    ) -> None:
        path = self.layout.storage_config(project_id)
        await self._prepare()
        await self._tenants.make_dir(project_id)
        data = json.dumps({"history_retention_seconds": history_retention_seconds}).encode()
        await asyncio.to_thread(write_atomic, path, data)
        # A shorter window frees at once; a longer one keeps more from now on. Archiving turns
        # on or off (0) at each compute's next start.
        for branch_id in ids(self.layout.project_dir(project_id) / "branches"):
            dirs = self._histories.dirs(project_id, branch_id)
            await self._histories.prune(dirs, history_retention_seconds)

    async def detach_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._replicas.stop_project(project_id)
        await self._tenants.detach(project_id)

    async def reattach_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._tenants.reattach(project_id)

    async def tenant_state(self, *, project_id: str) -> str:
        await self._prepare()  # the projects' filesystems mounted
        return self._tenants.state(project_id)

    async def delete_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._replicas.stop_project(project_id)
        await self._tenants.delete(project_id)

    async def close(self) -> None:
        # The postmasters keep running: they outlive the platform process by design.
        await self._histories.close()
        if self._postmasters.walls.autoscaler is not None:
            await self._postmasters.walls.autoscaler.close()
        self._postmasters.forget()
        self._spares.stop()
        await self._copies.close()
        await asyncio.to_thread(self._skeleton.tidy)

    async def _prepare(self) -> RunAs:
        """First use: the shared compute user, the directory skeleton, leftovers of a crash."""
        return await self._skeleton.prepare()

    async def _install(
        self, project_id: str, major: int, *, make_dir: bool = False
    ) -> tuple[PgInstall, RunAs]:
        """The runnable installation (its template built), and the project's user."""
        await self._prepare()
        install = await self._installs.runnable(major)
        if make_dir:
            return install, await self._tenants.make_dir(project_id)
        return install, await self._tenants.user(project_id)
