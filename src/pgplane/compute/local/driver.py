"""The local compute driver: the ComputeDriver contract on this machine, kept thin.

Each method validates ids (the only way they become paths), takes the lock of what it changes,
and delegates: installations and templates (installs), projects' users, directories and
archives (tenants, users), timeline and branch building, postmasters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping, Sequence, Set

from pgplane.compute.driver import (
    BranchStorage,
    ComputeAddress,
    ComputeSpec,
    ComputeUsage,
    RunningCompute,
    ShippingRound,
)
from pgplane.compute.local.branch_data import BranchData
from pgplane.compute.local.postgres.monitor import last_client_activity
from pgplane.compute.local.postgres.verifiers import read_verifiers
from pgplane.compute.local.storage import branch_storage
from pgplane.compute.local.tenants.sockets import remove_socket_dir

log = logging.getLogger(__name__)


class LocalComputeDriver(BranchData):
    """Postmasters on this machine, one per endpoint, their data under ``config.data_dir``."""

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
        got = await branch_storage(dirs, self._postmasters.running(dirs.pgdata), walk=walk)
        if self._shipped is None:
            return got
        kept = self._shipped.archived(project_id, branch_id)
        return dataclasses.replace(
            got,
            archived_at=kept.at,
            archived_bytes=kept.stored,
            unarchived_bytes=kept.waiting,
            unarchived_since=kept.waiting_since,
        )

    async def login_roles(
        self, spec: ComputeSpec, *, names: Sequence[str] | None = None
    ) -> Mapping[str, str] | None:
        if not await self.is_compute_running(
            project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
        ):
            return None
        socket_dir = self.layout.socket_dir(spec.endpoint_id)
        if names is None:  # a sync of them all: seldom, a session of its own
            return await read_verifiers(socket_dir, spec.port, None)
        return await self._role_lookups.read(socket_dir, spec.port, names)

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
        await self._role_lookups.forget(self.layout.socket_dir(endpoint_id))
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

    async def compute_halted(self, *, project_id: str, branch_id: str, endpoint_id: str) -> bool:
        current = self._postmasters.running(self.layout.pgdata(project_id, branch_id))
        if current is None or current.endpoint_id != endpoint_id:
            return False  # not running, or a replica's (whose stop asks it nothing first)
        return await self._postmasters.halted(current)

    async def running_computes(self) -> Sequence[RunningCompute]:
        found = list(await self._computes.adopt_running())
        return found + await self._replicas.adopt_running()

    async def detach_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._replicas.stop_project(project_id)
        await self._tenants.detach(project_id)

    async def reattach_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._tenants.reattach(project_id)

    async def attach_tenant(
        self,
        *,
        project_id: str,
        branch_ids: Sequence[str],
        pg_version: int,
        history_retention_seconds: int,
    ) -> None:
        await self._prepare()
        # Archived: the archive is the newest state. Otherwise (nothing here, or what a rebuild
        # stopped by a crash left) each branch is rebuilt, unless it was already.
        state = await asyncio.to_thread(self._tenants.state, project_id)
        if self._shipped is None or state in ("archived", "both"):
            await self._tenants.reattach(project_id)
            return
        await self.apply_storage_config(
            project_id=project_id, history_retention_seconds=history_retention_seconds
        )
        await self._shipped.rebuild(project_id, branch_ids, pg_version)

    def shared_storage(self) -> str | None:
        return None if self.shared is None else self.shared.identity

    async def ship_history(self, project_ids: Set[str] | None = None) -> ShippingRound | None:
        if self._shipped is None:
            return None
        await self._prepare()
        return await self._shipped.ship_all(project_ids)

    async def tenant_state(self, *, project_id: str) -> str:
        await self._prepare()  # the projects' filesystems mounted
        # Off the loop: with shared storage, a look there too (NFS may be slow to answer).
        return await asyncio.to_thread(self._tenants.state, project_id)

    async def delete_tenant(self, *, project_id: str) -> None:
        await self._prepare()
        await self._replicas.stop_project(project_id)
        await self._tenants.delete(project_id)
