"""The local compute driver: the ComputeDriver contract on this machine, kept thin.

Each method validates ids (the only way they become paths), takes the lock of what it changes,
and delegates: binaries and relocation, the template, timeline building, postmasters.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import (
    ComputeAddress,
    ComputeError,
    ComputeSpec,
    ConfigChange,
    DatabaseSpec,
    PortInUse,
    RoleSpec,
    RunningCompute,
)
from pgplane.compute.local import archive
from pgplane.compute.local.binaries import PgInstall, discover
from pgplane.compute.local.branch import build_branch
from pgplane.compute.local.catalog import apply_change, check_change
from pgplane.compute.local.cluster import ensure_template, template_pgdata
from pgplane.compute.local.config import LocalDriverConfig
from pgplane.compute.local.files import remove_tree, sweep_trash, write_atomic
from pgplane.compute.local.hba import write_hba
from pgplane.compute.local.layout import (
    TIMELINE_MARKER,
    Layout,
    check_id,
    ensure_dir,
    ensure_private_dir,
)
from pgplane.compute.local.monitor import check_readable, last_client_activity
from pgplane.compute.local.pidfile import PidFile, command_line, is_postmaster_of
from pgplane.compute.local.postmaster import (
    Postmasters,
    check_settings,
    postmaster_argv,
    validate_settings,
    wait_ready,
)
from pgplane.compute.local.relocate import runnable_install
from pgplane.compute.local.sizing import compute_settings
from pgplane.compute.local.spares import SparePool
from pgplane.compute.local.timeline import (
    INIT_PORT,
    build_timeline,
    fresh_socket_dir,
    temporary_pgdata,
)
from pgplane.compute.local.user import RunAs, open_traversal, resolve_run_as
from pgplane.compute.local.verifiers import read_verifiers
from pgplane.core import ports

log = logging.getLogger(__name__)

_ACCEPTED_MAX = 10_000


class LocalComputeDriver:
    """Postmasters on this machine, one per endpoint, their data under ``config.data_dir``."""

    def __init__(self, config: LocalDriverConfig) -> None:
        self._config = config
        self.layout = Layout(config.data_dir.resolve())
        # Probing runs `postgres --version` once per candidate: a few ms, once per process.
        self._installs = discover(config.pg_bin_dirs, bundled_only=config.bundled_only)
        self._postmasters = Postmasters()
        self._locks: defaultdict[tuple[object, ...], asyncio.Lock] = defaultdict(asyncio.Lock)
        self._run_as: RunAs | None = None
        self._runnable: dict[int, PgInstall] = {}
        self._accepted: set[tuple[int, str, str]] = set()  # (major, name, value) Postgres took
        self._spares = SparePool(self.layout.spares)
        self._refilling: asyncio.Task[None] | None = None

    @property
    def spares(self) -> SparePool:
        return self._spares

    def pg_versions(self) -> Sequence[int]:
        return list(self._installs)

    def installation(self, pg_version: int) -> PgInstall:
        """The installation found for a major version (before any relocation)."""
        install = self._installs.get(pg_version)
        if install is None:
            available = ", ".join(map(str, self._installs)) or "none"
            raise ComputeError(f"Postgres {pg_version} is not available (available: {available})")
        return install

    async def runnable_installation(self, pg_version: int) -> PgInstall:
        """The installation as the compute user runs it (relocated if it had to be)."""
        install, _ = await self._install(pg_version)
        return install

    def pgdata(self, project_id: str, branch_id: str) -> Path:
        return self.layout.pgdata(project_id, branch_id)

    def socket_dir(self, endpoint_id: str) -> Path:
        """Where the endpoint's postmaster puts its unix socket (``.s.PGSQL.<port>``)."""
        return self.layout.socket_dir(endpoint_id)

    def log_path(self, endpoint_id: str) -> Path:
        return self.layout.log_path(endpoint_id)

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
            if _completed(pgdata, pg_version):
                return
            install, run_as = await self._install(pg_version)
            await asyncio.to_thread(ensure_dir, pgdata.parent)
            await build_timeline(
                install=install,
                run_as=run_as,
                postmasters=self._postmasters,
                template=template_pgdata(self.layout.template(pg_version)),
                pgdata=pgdata,
                socket_dir=socket_dir,
                hba_file=self.layout.hba_file,
                roles=roles,
                databases=databases,
            )

    async def create_branch(
        self, *, project_id: str, parent_branch_id: str, branch_id: str, pg_version: int
    ) -> None:
        parent = self.layout.pgdata(project_id, parent_branch_id)
        pgdata = self.layout.pgdata(project_id, branch_id)
        self.installation(pg_version)
        if parent == pgdata:
            raise ComputeError(f"branch {branch_id} cannot be its own parent")
        async with self._locks["timeline", pgdata]:
            if _completed(pgdata, pg_version):
                return
            if not (parent / TIMELINE_MARKER).is_file():
                raise ComputeError(
                    f"parent branch {parent_branch_id} of project {project_id} has no data"
                )
            _check_data_version(parent, pg_version)
            install, run_as = await self._install(pg_version)
            await asyncio.to_thread(ensure_dir, pgdata.parent)
            # Held for the whole copy: a stopped parent cannot start under it, nor a running one
            # stop (its session holds the backup).
            async with self._locks["postmaster", parent]:
                stats = await build_branch(
                    install=install,
                    run_as=run_as,
                    postmasters=self._postmasters,
                    parent=parent,
                    pgdata=pgdata,
                    label=f"pgplane branch {project_id}/{branch_id}",
                    spares=self._spares,
                    disk_reserve_bytes=self._config.disk_reserve_bytes,
                )
        # Spares for the next two branches of this parent (branches often come in a burst: a
        # preview per pull request), made while nobody waits for them.
        self._spares.want(2 * stats.files, 2 * stats.dirs)
        self._refill_spares()

    def _refill_spares(self) -> None:
        if self._refilling is not None and not self._refilling.done():
            return  # the running fill keeps going while the pool is short
        if self._spares.needs_filling():
            self._refilling = asyncio.create_task(self._fill_spares())

    async def _fill_spares(self) -> None:
        try:
            made = await asyncio.to_thread(self._spares.fill)
        except Exception:  # spares only make copies quicker; a failure must not go unseen
            log.exception("making spare files in %s", self._spares.directory)
        else:
            log.debug("made %d spare files and directories", made)

    async def delete_timeline(self, *, project_id: str, branch_id: str) -> None:
        pgdata = self.layout.pgdata(project_id, branch_id)
        branch_dir = self.layout.branch_dir(project_id, branch_id)
        async with self._locks["timeline", pgdata]:
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                async with self._locks["postmaster", data_dir]:
                    current = self._postmasters.running(data_dir)
                    await self._postmasters.stop(data_dir)
                if current is not None and current.socket_dir is not None:
                    socket_dir = Path(current.socket_dir)
                    if socket_dir.parent == self.layout.run_root:
                        await asyncio.to_thread(shutil.rmtree, socket_dir, True)
            init_sockets = self.layout.init_socket_dir(project_id, branch_id)
            await asyncio.to_thread(shutil.rmtree, init_sockets, True)
            await remove_tree(branch_dir)

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

        await self._on_branch(project_id, branch_id, pg_version, compute, apply, start=True)

    async def check_availability(
        self, *, project_id: str, branch_id: str, pg_version: int, compute: ComputeSpec | None
    ) -> None:
        # A running compute is checked as it is, never restarted: the check must not disturb.
        await self._on_branch(
            project_id, branch_id, pg_version, compute, check_readable, start=False
        )

    async def _on_branch(
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
            argv, run_as = await self._compute_argv(compute)
            async with self._locks["postmaster", pgdata]:
                await self._ensure_running(compute, argv, run_as)
                await action(self.layout.socket_dir(compute.endpoint_id), compute.port)
            return
        self.installation(pg_version)
        if not (pgdata / TIMELINE_MARKER).is_file():
            raise ComputeError(f"branch {branch_id} of project {project_id} has no data directory")
        _check_data_version(pgdata, pg_version)
        install, run_as = await self._install(pg_version)
        socket_dir = self.layout.init_socket_dir(project_id, branch_id)
        async with self._locks["postmaster", pgdata]:
            current = self._postmasters.running(pgdata)
            if (
                current is not None
                and current.socket_dir not in (None, str(socket_dir))
                and current.port is not None
            ):
                # An endpoint serves the branch: act there.
                await action(Path(current.socket_dir), current.port)
                return
            # Nothing serves the branch (or only the temporary postmaster of a crashed attempt).
            await self._postmasters.stop(pgdata)
            await asyncio.to_thread(fresh_socket_dir, socket_dir, run_as)
            argv = postmaster_argv(
                install,
                pgdata,
                port=INIT_PORT,
                socket_dir=socket_dir,
                listen="",
                settings={},
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
                await action(socket_dir, INIT_PORT)
            finally:
                await self._postmasters.stop(pgdata)
                await asyncio.to_thread(shutil.rmtree, socket_dir, True)

    async def last_activity(self, spec: ComputeSpec) -> float | None:
        if not await self.is_compute_running(
            project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
        ):
            return None
        return await last_client_activity(self.layout.socket_dir(spec.endpoint_id), spec.port)

    async def login_roles(
        self, spec: ComputeSpec, *, names: Sequence[str] | None = None
    ) -> Mapping[str, str] | None:
        if not await self.is_compute_running(
            project_id=spec.project_id, branch_id=spec.branch_id, endpoint_id=spec.endpoint_id
        ):
            return None
        return await read_verifiers(self.layout.socket_dir(spec.endpoint_id), spec.port, names)

    async def check_settings(self, *, pg_version: int, settings: Mapping[str, str]) -> None:
        # Postgres is asked once per value: a setting it took stays valid for its binaries.
        unknown = {n: v for n, v in settings.items() if (pg_version, n, v) not in self._accepted}
        if not unknown:
            return
        install, run_as = await self._install(pg_version)
        await validate_settings(
            install, run_as, template_pgdata(self.layout.template(pg_version)), unknown
        )
        if len(self._accepted) > _ACCEPTED_MAX:
            self._accepted.clear()
        self._accepted.update((pg_version, n, v) for n, v in unknown.items())

    async def start_compute(self, spec: ComputeSpec) -> None:
        argv, run_as = await self._compute_argv(spec)
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        async with self._locks["postmaster", pgdata]:
            await self._ensure_running(spec, argv, run_as)

    async def _compute_argv(self, spec: ComputeSpec) -> tuple[list[str], RunAs]:
        """The endpoint's postmaster command line, after checking what it names."""
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        socket_dir = self.layout.socket_dir(spec.endpoint_id)
        settings = compute_settings(spec.autoscaling_limit_max_cu, check_settings(spec.pg_settings))
        self.installation(spec.pg_version)
        if not (pgdata / TIMELINE_MARKER).is_file():
            raise ComputeError(
                f"branch {spec.branch_id} of project {spec.project_id} has no data directory"
            )
        _check_data_version(pgdata, spec.pg_version)
        install, run_as = await self._install(spec.pg_version)
        argv = postmaster_argv(
            install,
            pgdata,
            port=spec.port,
            socket_dir=socket_dir,
            listen=self._config.listen_host,
            settings=settings,
            hba_file=self.layout.hba_file,
        )
        return argv, run_as

    async def _ensure_running(self, spec: ComputeSpec, argv: list[str], run_as: RunAs) -> None:
        """Start the endpoint's postmaster unless it runs as ``argv``; the caller holds the lock."""
        pgdata = self.layout.pgdata(spec.project_id, spec.branch_id)
        socket_dir = self.layout.socket_dir(spec.endpoint_id)
        log_path = self.layout.log_path(spec.endpoint_id)
        current = self._postmasters.running(pgdata)
        if current is not None:
            if _serves(current, argv, spec.port, socket_dir):
                await wait_ready(
                    socket_dir,
                    spec.port,
                    alive=lambda: is_postmaster_of(current.pid, pgdata),
                    log_path=log_path,
                )
                return
            log.info("restarting the postmaster of %s: its command line changed", pgdata)
            await self._postmasters.stop(pgdata)
        await asyncio.to_thread(self._prepare_endpoint, spec.project_id, spec.endpoint_id, run_as)
        # Checked first: Postgres would only say so in its log, after its start-up.
        if not await asyncio.to_thread(ports.is_free, spec.port, self._config.listen_host):
            raise PortInUse(spec.port)
        await self._postmasters.start(
            argv,
            pgdata=pgdata,
            port=spec.port,
            socket_dir=socket_dir,
            run_as=run_as,
            log_path=log_path,
        )

    def compute_address(self, *, endpoint_id: str, port: int) -> ComputeAddress:
        socket = self.layout.socket_dir(endpoint_id) / f".s.PGSQL.{port}"
        return ComputeAddress(host=self._config.listen_host, port=port, unix_socket=str(socket))

    async def stop_compute(self, *, project_id: str, branch_id: str, endpoint_id: str) -> None:
        pgdata = self.layout.pgdata(project_id, branch_id)
        socket_dir = self.layout.socket_dir(endpoint_id)
        async with self._locks["postmaster", pgdata]:
            await self._postmasters.stop(pgdata)
        await asyncio.to_thread(shutil.rmtree, socket_dir, True)

    async def is_compute_running(
        self, *, project_id: str, branch_id: str, endpoint_id: str
    ) -> bool:
        pgdata = self.layout.pgdata(project_id, branch_id)
        socket_dir = self.layout.socket_dir(endpoint_id)
        current = self._postmasters.running(pgdata)
        return current is not None and current.socket_dir == str(socket_dir)

    async def running_computes(self) -> Sequence[RunningCompute]:
        return await asyncio.to_thread(self._running_computes)

    def _running_computes(self) -> list[RunningCompute]:
        found = []
        for project_id in _ids(self.layout.projects):
            for branch_id in _ids(self.layout.project_dir(project_id) / "branches"):
                pgdata = self.layout.pgdata(project_id, branch_id)
                for data_dir in (pgdata, temporary_pgdata(pgdata)):
                    current = self._postmasters.running(data_dir)
                    if current is None:
                        continue
                    socket_dir = Path(current.socket_dir) if current.socket_dir else None
                    endpoint_id = None
                    if (
                        data_dir == pgdata
                        and socket_dir is not None
                        and socket_dir.parent == self.layout.run_root
                        and not socket_dir.name.startswith("init-")
                    ):
                        endpoint_id = socket_dir.name
                    found.append(RunningCompute(project_id, branch_id, endpoint_id))
        return found

    async def apply_storage_config(
        self, *, project_id: str, history_retention_seconds: int
    ) -> None:
        path = self.layout.storage_config(project_id)
        await self._prepare()
        data = json.dumps({"history_retention_seconds": history_retention_seconds}).encode()
        await asyncio.to_thread(ensure_dir, path.parent)
        await asyncio.to_thread(write_atomic, path, data)

    async def detach_tenant(self, *, project_id: str) -> None:
        project_dir = self.layout.project_dir(project_id)
        archive_dir = self.layout.archive(project_id)
        await self._prepare()
        async with self._locks["tenant", project_id]:
            if not project_dir.exists():
                if archive_dir.exists():
                    await asyncio.to_thread(archive.verify, archive_dir)
                    return  # detached already (a retry after the hot copy was freed)
                raise ComputeError(f"project {project_id} has no data to detach")
            await self._stop_project(project_id)
            await asyncio.to_thread(ensure_dir, self.layout.archives, 0o700)
            await asyncio.to_thread(archive.pack, project_dir, archive_dir)
            # Proven readable before the only other copy goes.
            await asyncio.to_thread(archive.verify, archive_dir)
            await failpoints.reached("tenant_detach:packed")
            await remove_tree(project_dir)
            for endpoint_id in _ids(self.layout.endpoint_records(project_id)):
                await asyncio.to_thread(shutil.rmtree, self.layout.socket_dir(endpoint_id), True)

    async def reattach_tenant(self, *, project_id: str) -> None:
        project_dir = self.layout.project_dir(project_id)
        archive_dir = self.layout.archive(project_id)
        run_as = await self._prepare()
        async with self._locks["tenant", project_id]:
            if not archive_dir.exists():
                if project_dir.exists():
                    return  # attached already
                raise ComputeError(f"project {project_id} has neither data nor an archive")
            if not project_dir.exists():
                # Unpacked beside, verified file by file, then renamed into place: all or nothing.
                await asyncio.to_thread(archive.unpack, archive_dir, project_dir)
                await asyncio.to_thread(self._give_to_computes, project_id, run_as)
            await failpoints.reached("tenant_reattach:unpacked")
            # Both present: a detach stopped before freeing the hot copy, or this reattach
            # before dropping the archive. The hot copy is whole (renames are atomic) and the
            # computes were stopped before packing, so the archive holds nothing newer.
            await remove_tree(archive_dir)

    async def tenant_state(self, *, project_id: str) -> str:
        hot = self.layout.project_dir(project_id).exists()
        archived = self.layout.archive(project_id).exists()
        return {(True, True): "both", (True, False): "hot", (False, True): "archived"}.get(
            (hot, archived), "none"
        )

    def _give_to_computes(self, project_id: str, run_as: RunAs) -> None:
        """Data directories belong to the compute user (extraction as root made them root's)."""
        if not run_as.switch:
            return
        for branch_id in _ids(self.layout.project_dir(project_id) / "branches"):
            pgdata = self.layout.pgdata(project_id, branch_id)
            if not pgdata.is_dir():
                continue
            run_as.chown(pgdata)
            for dirpath, dirnames, filenames in os.walk(pgdata):
                for name in [*dirnames, *filenames]:
                    run_as.chown(Path(dirpath) / name)

    async def _stop_project(self, project_id: str) -> None:
        for branch_id in _ids(self.layout.project_dir(project_id) / "branches"):
            pgdata = self.layout.pgdata(project_id, branch_id)
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                async with self._locks["postmaster", data_dir]:
                    await self._postmasters.stop(data_dir)
            init_sockets = self.layout.init_socket_dir(project_id, branch_id)
            await asyncio.to_thread(shutil.rmtree, init_sockets, True)

    async def delete_tenant(self, *, project_id: str) -> None:
        project_dir = self.layout.project_dir(project_id)
        await remove_tree(self.layout.archive(project_id))
        if not project_dir.exists():
            return
        await self._stop_project(project_id)
        endpoint_ids = list(_ids(self.layout.endpoint_records(project_id)))
        await remove_tree(project_dir)
        for endpoint_id in endpoint_ids:
            await asyncio.to_thread(shutil.rmtree, self.layout.socket_dir(endpoint_id), True)
            self.layout.log_path(endpoint_id).unlink(missing_ok=True)

    async def close(self) -> None:
        # The postmasters keep running: they outlive the platform process by design.
        self._postmasters.forget()
        self._spares.stop()
        if self._refilling is not None:
            await self._refilling
        run_root = self.layout.run_root
        if not run_root.is_relative_to(self.layout.data_dir):
            # Tidy /tmp when no endpoint uses the fallback socket root any more.
            with contextlib.suppress(OSError):
                run_root.rmdir()

    async def _prepare(self) -> RunAs:
        """First use: the compute user, the directory skeleton, leftovers of a crash."""
        if self._run_as is None:
            async with self._locks["prepare",]:
                if self._run_as is None:
                    run_as = await resolve_run_as(self._config.compute_user)
                    await asyncio.to_thread(self._make_dirs, run_as)
                    await sweep_trash(self.layout.projects)
                    await sweep_trash(self.layout.archives)
                    self._run_as = run_as
        return self._run_as

    def _make_dirs(self, run_as: RunAs) -> None:
        layout = self.layout
        if not layout.data_dir.exists():
            ensure_dir(layout.data_dir)
        open_traversal(layout.data_dir, run_as)
        for directory in (layout.projects, layout.templates):
            ensure_dir(directory)
        self._spares.adopt()
        ensure_dir(layout.installs, 0o755)
        write_hba(layout.hba_file)
        ensure_dir(layout.logs, 0o700)
        if layout.run_root.is_relative_to(layout.data_dir):
            ensure_dir(layout.run_root)
        else:
            ensure_private_dir(layout.run_root)

    async def _install(self, major: int) -> tuple[PgInstall, RunAs]:
        """The installation the compute user can run, with its template built."""
        run_as = await self._prepare()
        if major not in self._runnable:
            async with self._locks["install", major]:
                if major not in self._runnable:
                    install = self.installation(major)
                    install = await runnable_install(
                        install, run_as, self.layout.install_copy(major)
                    )
                    await ensure_template(install, run_as, self.layout.template(major))
                    self._runnable[major] = install
        return self._runnable[major], run_as

    def _prepare_endpoint(self, project_id: str, endpoint_id: str, run_as: RunAs) -> None:
        # Recorded so delete_tenant finds the endpoint's socket directory and log.
        records = ensure_dir(self.layout.endpoint_records(project_id))
        (records / endpoint_id).touch()
        socket_dir = self.layout.socket_dir(endpoint_id)
        socket_dir.mkdir(mode=0o700, exist_ok=True)
        socket_dir.chmod(0o700)
        run_as.chown(socket_dir)


def _serves(current: PidFile, argv: Sequence[str], port: int, socket_dir: Path) -> bool:
    """Whether the running postmaster is the one we would start (same port, socket, settings)."""
    if current.port != port or current.socket_dir != str(socket_dir):
        return False
    running_argv = command_line(current.pid)
    if running_argv is None or "-D" not in running_argv:
        return True  # no /proc, or a process title rewritten: the port and socket must do
    # Only the arguments: the binary's path may differ (a relocated copy) without mattering.
    return running_argv[1:] == list(argv[1:])


def _completed(pgdata: Path, pg_version: int) -> bool:
    """Whether the timeline at ``pgdata`` was built already (a retry); refuses a stranger's."""
    if (pgdata / TIMELINE_MARKER).is_file():
        _check_data_version(pgdata, pg_version)
        return True
    if pgdata.exists():
        raise ComputeError(f"{pgdata} exists but was not completed by pgplane")
    return False


def _check_data_version(pgdata: Path, pg_version: int) -> None:
    data_version = (pgdata / "PG_VERSION").read_text().strip()
    if data_version != str(pg_version):
        raise ComputeError(f"{pgdata} holds Postgres {data_version} data, not {pg_version}")


def _ids(directory: Path) -> Iterator[str]:
    """Entries of ``directory`` that are valid ids (anything else was never ours)."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        try:
            yield check_id("id", entry.name)
        except ComputeError:
            continue
