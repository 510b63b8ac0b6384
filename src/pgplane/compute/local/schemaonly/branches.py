"""Schema-only branches: a new root timeline holding its source's roles and schema, no rows.

1. The source is read once (``source``), as ``dump_schema`` reads it: through its running
   compute, or a temporary postmaster on a suspended branch's data (never waking its compute),
   or a postmaster on its data rebuilt at the point asked for (``PointReads.run``).
2. The new cluster is built as a project's root branch is (``build_timeline``: a copy of the
   template in ``pgdata.tmp``, a socket-only postmaster as the project's user, sandboxed,
   published by a rename once durable), filled by ``target`` and ``restore`` instead of the
   API's roles and databases.
3. Its history starts with it, as a project's root branch's: the template is its first base
   state and the WAL of the build is archived from the first write. A retry starts from nothing
   (whatever an interrupted build archived is thrown away with its data).

A retry after the data was published only reads back the verifiers its login roles hold.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ConfigChange, Point
from pgplane.compute.local.copies.timeline import build_timeline, completed
from pgplane.compute.local.files import remove_tree
from pgplane.compute.local.history.histories import Histories
from pgplane.compute.local.history.point_reads import PointReads
from pgplane.compute.local.layout import ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.catalog import apply_change, check_change
from pgplane.compute.local.postgres.cluster import create_roles_and_databases
from pgplane.compute.local.postgres.computes import Computes
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.postgres.verifiers import read_verifiers
from pgplane.compute.local.schemaonly import target
from pgplane.compute.local.schemaonly.restore import replay
from pgplane.compute.local.schemaonly.source import SchemaSource, SourceReader
from pgplane.compute.local.tenants.cgroups import PLATFORM_WORK
from pgplane.compute.local.tenants.user import RunAs

InstallFor = Callable[..., Awaitable[tuple[PgInstall, RunAs]]]


class SchemaOnly:
    def __init__(
        self,
        *,
        histories: Histories,
        computes: Computes,
        reads: PointReads,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        install: InstallFor,
        template: Callable[[int], Path],
        template_owner: Callable[[], Awaitable[RunAs]],
    ) -> None:
        self.layout = histories.layout
        self._histories = histories
        self._computes = computes
        self._reads = reads
        self._postmasters = postmasters
        self._locks = locks
        self._install = install
        self._template = template
        self._template_owner = template_owner

    async def create(
        self,
        *,
        project_id: str,
        source_branch_id: str,
        branch_id: str,
        pg_version: int,
        point: Point | None,
        max_bytes: int,
        config: ConfigChange,
    ) -> Mapping[str, str]:
        """The new branch's data, and the verifiers of its login roles."""
        check_change(config)
        pgdata = self.layout.pgdata(project_id, branch_id)
        async with self._locks["timeline", pgdata]:
            if completed(pgdata, pg_version):
                return await self._verifiers(project_id, branch_id, pg_version)
            install, run_as = await self._install(project_id, pg_version, make_dir=True)
            reader = SourceReader(install, run_as, self._postmasters.walls, max_bytes)
            if point is None:
                await self._computes.on_branch(
                    project_id, source_branch_id, pg_version, None, reader, start=False
                )
            else:
                await self._reads.run(project_id, source_branch_id, pg_version, point, reader)
            await failpoints.reached("schema_only:read")
            await asyncio.to_thread(ensure_dir, pgdata.parent)
            await self._forget_history(project_id, branch_id)
            template = self._template(pg_version)
            populate = _Populate(install, run_as, self._postmasters, reader.source, config)
            archiving = await self._computes.history_settings(project_id, branch_id, run_as)
            async with self._histories.first_base(
                project_id,
                branch_id,
                install,
                template,
                await self._template_owner(),
                archiving=bool(archiving),
            ) as copy_from:
                await build_timeline(
                    install=install,
                    run_as=run_as,
                    postmasters=self._postmasters,
                    template=template,
                    copy_from=copy_from,
                    pgdata=pgdata,
                    socket_dir=self.layout.init_socket_dir(project_id, branch_id),
                    hba_file=self.layout.hba_file,
                    roles=(),
                    databases=(),
                    settings=archiving,
                    populate=populate,
                    # The schema's functions run as it is restored (an index expression, a
                    # generated column): in a cgroup of the smallest compute's size, as the
                    # tenant's code always is, never with the platform's whole machine.
                    limits=PLATFORM_WORK,
                )
        return populate.verifiers

    async def _forget_history(self, project_id: str, branch_id: str) -> None:
        """What an interrupted build archived belongs to data that is gone."""
        dirs = self._histories.dirs(project_id, branch_id)
        async with self._locks["base", dirs.branch_dir], self._locks["history", dirs.branch_dir]:
            await remove_tree(dirs.wal)
            await remove_tree(dirs.bases)

    async def _verifiers(
        self, project_id: str, branch_id: str, pg_version: int
    ) -> Mapping[str, str]:
        found: dict[str, str] = {}

        async def read(socket_dir: Path, port: int) -> None:
            found.update(await read_verifiers(socket_dir, port, None))

        await self._computes.on_branch(project_id, branch_id, pg_version, None, read, start=False)
        return found


class _Populate:
    """The new cluster's filling (``build_timeline``'s ``populate``)."""

    def __init__(
        self,
        install: PgInstall,
        run_as: RunAs,
        postmasters: Postmasters,
        source: SchemaSource,
        config: ConfigChange,
    ) -> None:
        self._install, self._run_as = install, run_as
        self._walls = postmasters.walls
        self._source = source
        self._config = config
        self.verifiers: Mapping[str, str] = {}

    async def __call__(self, socket_dir: Path, port: int) -> None:
        source = self._source
        await create_roles_and_databases(socket_dir, port, (), ())  # the platform's monitor
        restorer = target.restorer_name(source)
        await target.prepare(socket_dir, port, source, restorer)
        for db in source.databases:
            await replay(
                self._install,
                self._run_as,
                self._walls,
                socket_dir,
                port,
                user=restorer,
                dbname=db.name,
                sql=db.sql,
            )
        await target.finish(socket_dir, port, source, restorer)
        # What the branch's roles and databases in the store name that the source did not hold
        # (made after the point, say): created, so every connection string it shows holds.
        held = {r.name for r in source.roles}, {d.name for d in source.databases}
        missing = ConfigChange(
            roles=[r for r in self._config.roles if r.name not in held[0]],
            databases=[d for d in self._config.databases if d.name not in held[1]],
        )
        if missing.roles or missing.databases:
            await apply_change(socket_dir, port, missing)
        self.verifiers = await read_verifiers(socket_dir, port, None)
        # Killed here, the cluster being built is left running: the next attempt stops it.
        await failpoints.reached("schema_only:restored")
