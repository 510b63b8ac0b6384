"""The local driver's parts, built once from its configuration and wired to each other.

Postmasters, installations, projects' users and volumes, computes, spares, histories, point
reads, copies, snapshots, replicas and schema-only builds: each is a class of its own folder;
this is where they meet. :class:`LocalComputeDriver` is these parts and the contract's methods.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pgplane.compute.local.config import LocalDriverConfig
from pgplane.compute.local.copies.copies import Copies
from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.history.histories import Histories
from pgplane.compute.local.history.point_reads import PointReads
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.computes import Computes
from pgplane.compute.local.postgres.installs import Installs
from pgplane.compute.local.postgres.limits.size_limit import SizeLimit
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.role_lookups import RoleLookups
from pgplane.compute.local.replicas.replicas import Replicas
from pgplane.compute.local.schemaonly.branches import SchemaOnly
from pgplane.compute.local.shared.history import SharedHistory
from pgplane.compute.local.shared.objects import DirectoryStore, ObjectStore
from pgplane.compute.local.shared.receiver import Streams
from pgplane.compute.local.shared.shipping import has_base, prefix_of, shipped_wal
from pgplane.compute.local.skeleton import Skeleton
from pgplane.compute.local.snapshots.snapshots import Snapshots
from pgplane.compute.local.tenants.projects import Tenants
from pgplane.compute.local.tenants.user import RunAs
from pgplane.compute.local.tenants.users import ComputeUsers
from pgplane.compute.local.tenants.volumes import Volumes
from pgplane.compute.local.tenants.walls import Walls

log = logging.getLogger(__name__)


class LocalParts:
    """The parts of the local driver and what they share (the directory layout, the locks)."""

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
        self.shared: ObjectStore | None = config.object_store or (
            None if config.shared_dir is None else DirectoryStore(config.shared_dir)
        )
        self._tenants = Tenants(
            self.layout, self.users, self._postmasters, self._locks, self.volumes, self.shared
        )
        # With an object store, each running compute's WAL is streamed there as it is written.
        objects = config.object_store
        self._streams = (
            None
            if objects is None
            else Streams(
                objects,
                synchronous=config.archive_sync,
                prefix_of=prefix_of,
                shipped=lambda prefix: shipped_wal(objects, prefix),
                based=lambda prefix: has_base(objects, prefix),
            )
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
            archive_timeout_seconds=config.archive_timeout_seconds if self.shared else 0,
            streams=self._streams,
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
        # The proxy's lookups of roles made with SQL: one session per running compute.
        self._role_lookups = RoleLookups()
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
        self._shipped = (
            None
            if self.shared is None
            else SharedHistory(
                store=self.shared,
                layout=self.layout,
                postmasters=self._postmasters,
                locks=self._locks,
                install=self._install,
                project_dir=self._project_dir,
                archive_timeout_seconds=config.archive_timeout_seconds,
                streams=self._streams,
            )
        )
        self._snapshots = Snapshots(
            layout=self.layout,
            postmasters=self._postmasters,
            locks=self._locks,
            copies=self._copies,
            histories=self._histories,
            install=self._install,
            shared=self.shared,
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

    async def close(self) -> None:
        # The postmasters keep running: they outlive the platform process by design.
        if self._streams is not None:
            await asyncio.to_thread(self._streams.stop_all)
        await self._histories.close()
        if self._postmasters.walls.autoscaler is not None:
            await self._postmasters.walls.autoscaler.close()
        await self._role_lookups.close()
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
        # Both at once: on a node's first use of the version, and the project's, each takes a
        # few hundred ms (a template built; a user created, a volume made and mounted).
        return await asyncio.gather(
            self._installs.runnable(major),
            self._tenants.make_dir(project_id) if make_dir else self._tenants.user(project_id),
        )

    async def _project_dir(self, project_id: str) -> RunAs:
        """The project's directory, made if missing, and its user."""
        await self._prepare()
        return await self._tenants.make_dir(project_id)
