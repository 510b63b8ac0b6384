"""The local driver's methods for a branch's data: creating it (from a parent, its history, a
snapshot or a schema), restoring and deleting it, converging its roles and databases, checking
it, reading its schema, keeping its history and snapshots and its storage settings.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from pgplane.compute.driver import (
    ColumnMask,
    ComputeError,
    ComputeSpec,
    ConfigChange,
    DatabaseSpec,
    HistoryBounds,
    Point,
    RoleSpec,
)
from pgplane.compute.local.copies.timeline import build_timeline, completed
from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.layout import ensure_dir
from pgplane.compute.local.masking import mask
from pgplane.compute.local.parts import LocalParts
from pgplane.compute.local.postgres.catalog import apply_change, check_change
from pgplane.compute.local.postgres.monitor import check_readable
from pgplane.compute.local.tenants.projects import ids
from pgplane.compute.snapshots import SnapshotMade

log = logging.getLogger(__name__)


class BranchData(LocalParts):
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
            archiving = await self._computes.history_settings(project_id, branch_id, run_as)
            # Archived from its first write: its history starts with the template it copies,
            # staged as its first base state.
            async with self._histories.first_base(
                project_id,
                branch_id,
                install,
                template,
                await self.users.shared(),
                archiving=bool(archiving),
            ) as copy_from:
                await build_timeline(
                    install=install,
                    run_as=run_as,
                    postmasters=self._postmasters,
                    template=template,
                    copy_from=copy_from,
                    pgdata=pgdata,
                    socket_dir=socket_dir,
                    hba_file=self.layout.hba_file,
                    roles=roles,
                    databases=databases,
                    settings=archiving,
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

    async def fetch_snapshot(self, *, project_id: str, snapshot_id: str) -> bool:
        """The snapshot brought back from shared or object storage (a platform recovered);
        False when it is not there."""
        return await self._snapshots.fetch(project_id=project_id, snapshot_id=snapshot_id)

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

    async def anonymize(
        self,
        *,
        project_id: str,
        branch_id: str,
        pg_version: int,
        compute: ComputeSpec | None,
        masks: Sequence[ColumnMask],
    ) -> int:
        masked = 0

        async def apply(socket_dir: Path, port: int) -> None:
            nonlocal masked
            masked = await mask(socket_dir, port, masks)

        self.installation(pg_version)
        await self._computes.on_branch(
            project_id, branch_id, pg_version, compute, apply, start=True
        )
        return masked

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
