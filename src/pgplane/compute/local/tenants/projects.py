"""A project's files as a whole: its user and directories, and its cold archive.

Who owns what under ``projects/<project_id>/``:

- the project directory is root's, group the project's, mode 0710: only the project's user
  (and root) may pass through it, so no other project's user even reaches its paths;
- ``storage.json``, ``endpoints/`` and the branch directories (with the logs of temporary
  postmasters) are root's: the platform's records, which the tenant may not change;
- each ``pgdata`` is the project user's, 0700: Postgres insists on owning it.

A tree from an earlier version (everything the shared compute user's) is given to the
project's user when first used (``claim``): a data directory whose top is not yet the user's is
handed over, as the postmasters that still run as the shared user stop and start again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError
from pgplane.compute.local.cold import archive
from pgplane.compute.local.copies.timeline import temporary_pgdata
from pgplane.compute.local.files import fsync_dir, remove_tree
from pgplane.compute.local.layout import Layout, check_id, ensure_dir
from pgplane.compute.local.postgres.postmaster import Postmasters
from pgplane.compute.local.shared import cold
from pgplane.compute.local.shared.objects import ObjectStore, off_loop
from pgplane.compute.local.tenants.ownership import hand_over, owned_by
from pgplane.compute.local.tenants.sockets import remove_socket_dir
from pgplane.compute.local.tenants.user import RunAs, open_traversal
from pgplane.compute.local.tenants.users import ComputeUsers, end_processes
from pgplane.compute.local.tenants.volumes import Volumes

PROJECT_DIR_MODE = 0o710


class Tenants:
    """Projects' users, directories, archives and removal, for the driver."""

    def __init__(
        self,
        layout: Layout,
        users: ComputeUsers,
        postmasters: Postmasters,
        locks: defaultdict[tuple[object, ...], asyncio.Lock],
        volumes: Volumes,
        shared: ObjectStore | None = None,
    ) -> None:
        self._layout = layout
        self.volumes = volumes
        # Where the cold archive goes to be reached by every node; None: this node's disk only.
        self.shared = shared
        self._users = users
        self._postmasters = postmasters
        self._locks = locks
        self._ready: set[str] = set()

    async def user(self, project_id: str) -> RunAs:
        """The project's user, created and given its project directory on first use."""
        run_as = await self._users.project(project_id)
        if project_id not in self._ready:
            await asyncio.to_thread(self._prepare, project_id, run_as)
            self._ready.add(project_id)
        return run_as

    def _prepare(self, project_id: str, run_as: RunAs) -> None:
        open_traversal(self._layout.projects, run_as)
        project_dir = self._layout.project_dir(project_id)
        if project_dir.is_dir():  # made by an earlier version, maybe: mended
            project_dir_for(project_dir, run_as)

    async def make_dir(self, project_id: str) -> RunAs:
        """The project's directory, made if missing (a detached project's is not: see
        ``state``); its user."""
        run_as = await self.user(project_id)
        project_dir = self._layout.project_dir(project_id)
        if not await asyncio.to_thread(os.path.ismount, project_dir):
            await asyncio.to_thread(self.volumes.ensure, project_id, project_dir)
            await failpoints.reached("project_volume:mounted")
        await asyncio.to_thread(project_dir_for, project_dir, run_as)
        return run_as

    async def claim(self, pgdata: Path, run_as: RunAs) -> None:
        """Give a data directory of an earlier version to the project's user; nothing runs on
        it (the caller holds its postmaster lock)."""
        if await asyncio.to_thread(owned_by, pgdata, run_as):
            return
        shared = await self._users.shared()
        # Its completed WAL segments are linked into the branch's archive too (``wal``).
        await asyncio.to_thread(
            hand_over,
            pgdata,
            {os.geteuid(), shared.uid},
            run_as,
            linked_within=[pgdata.with_name("wal")],
        )

    async def stop(self, project_id: str) -> None:
        """Stop every postmaster of the project, then whatever else its user left running."""
        for branch_id in ids(self._layout.project_dir(project_id) / "branches"):
            pgdata = self._layout.pgdata(project_id, branch_id)
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                async with self._locks["postmaster", data_dir]:
                    await self._postmasters.stop(data_dir)
            init_sockets = self._layout.init_socket_dir(project_id, branch_id)
            await asyncio.to_thread(shutil.rmtree, init_sockets, True)
            wal_sockets = self._layout.wal_socket_dir(project_id, branch_id)
            await asyncio.to_thread(remove_socket_dir, wal_sockets)
        run_as = await asyncio.to_thread(self._users.find, project_id)
        if run_as is not None:
            await asyncio.to_thread(end_processes, run_as)

    async def delete_branch(self, project_id: str, branch_id: str) -> None:
        """A branch's postmasters stopped, its socket directories and files removed."""
        pgdata = self._layout.pgdata(project_id, branch_id)
        branch_dir = self._layout.branch_dir(project_id, branch_id)
        async with self._locks["timeline", pgdata]:
            for data_dir in (pgdata, temporary_pgdata(pgdata)):
                async with self._locks["postmaster", data_dir]:
                    current = self._postmasters.running(data_dir)
                    await self._postmasters.stop(data_dir)
                # Where the platform started it (its record, root's): an endpoint's socket
                # directory, which only that branch's postmaster used.
                if current is not None and current.socket_dir.parent == self._layout.run_root:
                    await asyncio.to_thread(remove_socket_dir, current.socket_dir)
            init_sockets = self._layout.init_socket_dir(project_id, branch_id)
            await asyncio.to_thread(shutil.rmtree, init_sockets, True)
            wal_sockets = self._layout.wal_socket_dir(project_id, branch_id)
            await asyncio.to_thread(remove_socket_dir, wal_sockets)
            await failpoints.reached("delete_timeline:stopped")
            # Under the history keeper's locks (its order: base, then history): a keeper pass
            # that listed the branch before it went would otherwise write its catalog into a
            # branch directory made anew (an expiry at the first tick after start-up met it).
            async with self._locks["base", branch_dir], self._locks["history", branch_dir]:
                await remove_tree(branch_dir)
                if self.shared is not None:  # its history shipped there
                    prefix = f"history/{project_id}/{branch_id}"
                    await off_loop(self.shared.delete, prefix)
            conf = self._layout.compute_conf(project_id, branch_id)
            await asyncio.to_thread(conf.unlink, missing_ok=True)

    async def detach(self, project_id: str) -> None:
        """The project's tree packed into its archive (on shared storage too, when there is
        some), then the hot copy freed. With shared storage the archive is made here first, as
        without (a disk's speed, and a local copy if the storage falters), then stored and
        verified there, and only then is the hot copy freed and the local archive dropped."""
        project_dir = self._layout.project_dir(project_id)
        archive_dir = self._layout.archive(project_id)
        async with self._locks["tenant", project_id]:
            if not hot(project_dir):
                if archive_dir.exists():
                    await asyncio.to_thread(archive.verify, archive_dir)
                    await self._store_archive(project_id, archive_dir)
                    return  # detached already (a retry after the hot copy was freed)
                if self.shared is not None and await self._stored(project_id):
                    await off_loop(cold.verify, self.shared, cold.prefix_of(project_id))
                    return
                raise ComputeError(f"project {project_id} has no data to detach")
            # Nothing of the tenant may run while root reads its tree (see archive.py).
            await self.stop(project_id)
            await asyncio.to_thread(ensure_dir, self._layout.archives, 0o700)
            await asyncio.to_thread(archive.pack, project_dir, archive_dir)
            # Proven readable before the only other copy goes.
            await asyncio.to_thread(archive.verify, archive_dir)
            await failpoints.reached("tenant_detach:packed")
            if self.shared is not None:
                await self._store_archive(project_id, archive_dir, keep_local=True)
                await failpoints.reached("tenant_detach:stored")
            await self._remove(project_id, project_dir)
            for endpoint_id in ids(self._layout.endpoint_records(project_id)):
                socket_dir = self._layout.socket_dir(endpoint_id)
                await asyncio.to_thread(remove_socket_dir, socket_dir)
            if self.shared is not None:
                await remove_tree(archive_dir)

    async def _store_archive(
        self, project_id: str, archive_dir: Path, *, keep_local: bool = False
    ) -> None:
        """The local archive on shared storage, verified there (then dropped here, unless
        ``keep_local``); nothing without shared storage."""
        if self.shared is None:
            return
        prefix = cold.prefix_of(project_id)
        manifest = await off_loop(cold.upload, self.shared, prefix, archive_dir)
        if await off_loop(cold.verify, self.shared, prefix) != manifest:
            raise ComputeError(f"archive of {project_id} read back from shared storage differs")
        if not keep_local:
            await remove_tree(archive_dir)

    async def _stored(self, project_id: str) -> bool:
        if self.shared is None:
            return False
        found = await off_loop(cold.manifest_of, self.shared, cold.prefix_of(project_id))
        return found is not None

    async def reattach(self, project_id: str) -> None:
        project_dir = self._layout.project_dir(project_id)
        archive_dir = self._layout.archive(project_id)
        run_as = await self._users.project(project_id)
        async with self._locks["tenant", project_id]:
            local = archive_dir.exists()
            stored = await self._stored(project_id)
            if not local and not stored:
                if hot(project_dir):
                    return  # attached already
                raise ComputeError(f"project {project_id} has neither data nor an archive")
            if not hot(project_dir):
                if not local:  # detached on another node: fetched, checked as it arrives
                    assert self.shared is not None  # noqa: S101 - stored says so
                    await asyncio.to_thread(ensure_dir, self._layout.archives, 0o700)
                    prefix = cold.prefix_of(project_id)
                    await off_loop(cold.download, self.shared, prefix, archive_dir)
                    await failpoints.reached("tenant_reattach:fetched")
                # Unpacked beside, verified file by file, then renamed into place: all or
                # nothing. Root's until its data directories are handed over, bottom-up.
                await asyncio.to_thread(self._unpack, project_id, archive_dir, project_dir)
            await asyncio.to_thread(self._give_back, project_id, run_as)
            await failpoints.reached("tenant_reattach:unpacked")
            # Both present: a detach stopped before freeing the hot copy, or this reattach
            # before dropping the archive. The hot copy is whole (renames are atomic) and the
            # computes were stopped before packing, so the archive holds nothing newer.
            await remove_tree(archive_dir)
            if self.shared is not None:
                await off_loop(self.shared.delete, cold.prefix_of(project_id))

    def _unpack(self, project_id: str, archive_dir: Path, project_dir: Path) -> None:
        if not self.volumes.active:
            archive.unpack(archive_dir, project_dir)
            return
        # Onto a fresh filesystem of its own: unpacked inside it (a rename cannot cross into
        # it), then moved up entry by entry, ``branches`` last: its arrival makes the project
        # whole (``hot``), so a crash before it unpacks again.
        self.volumes.ensure(project_id, project_dir)
        staged = project_dir / "restored"
        if not staged.exists():  # renamed into place whole by unpack, or not there at all
            archive.unpack(archive_dir, staged)
        for entry in sorted(staged.iterdir(), key=lambda p: p.name == "branches"):
            os.replace(entry, project_dir / entry.name)
        fsync_dir(project_dir)
        staged.rmdir()

    async def _remove(self, project_id: str, project_dir: Path) -> None:
        """The project's hot copy gone: its filesystem, or its tree in the data directory."""
        if self.volumes.has(project_id, project_dir):
            await asyncio.to_thread(self.volumes.remove, project_id, project_dir)
        else:
            await remove_tree(project_dir)

    def _give_back(self, project_id: str, run_as: RunAs) -> None:
        project_dir_for(self._layout.project_dir(project_id), run_as)
        for branch_id in ids(self._layout.project_dir(project_id) / "branches"):
            pgdata = self._layout.pgdata(project_id, branch_id)
            # The archive of its history too: its postmasters write it.
            trees = (pgdata, pgdata.with_name("wal"))
            for tree in trees:
                if tree.is_dir() and not owned_by(tree, run_as):
                    hand_over(tree, {os.geteuid()}, run_as, linked_within=trees)

    def state(self, project_id: str) -> str:
        hot_copy = hot(self._layout.project_dir(project_id))
        archived = self._layout.archive(project_id).exists()
        if not archived and self.shared is not None:
            try:
                archived = self.shared.exists(f"{cold.prefix_of(project_id)}/manifest.json")
            except ComputeError:
                if not hot_copy:
                    raise  # where its data is cannot be told
                # Its data is here: the copy there (if any) only makes it "both", which
                # nothing here needs before the store answers again.
        return {(True, True): "both", (True, False): "hot", (False, True): "archived"}.get(
            (hot_copy, archived), "none"
        )

    async def delete(self, project_id: str) -> None:
        project_dir = self._layout.project_dir(project_id)
        # Under the tenant lock, which the history keeper holds for each branch it keeps: a pass
        # that listed the project before it went would otherwise write its catalog into a
        # branch directory made anew on the host's disk (a crash test met it).
        async with self._locks["tenant", project_id]:
            await remove_tree(self._layout.archive(project_id))
            if self.shared is not None:  # its archive and shipped history, wherever made
                await off_loop(self.shared.delete, cold.prefix_of(project_id))
                await off_loop(self.shared.delete, f"history/{project_id}")
                await off_loop(self.shared.delete, f"snapshots/{project_id}")
            if project_dir.exists():
                await self.stop(project_id)
                await failpoints.reached("delete_tenant:stopped")
                endpoint_ids = list(ids(self._layout.endpoint_records(project_id)))
                await self._remove(project_id, project_dir)
                for endpoint_id in endpoint_ids:
                    socket_dir = self._layout.socket_dir(endpoint_id)
                    await asyncio.to_thread(remove_socket_dir, socket_dir)
                    self._layout.old_log_path(endpoint_id).unlink(missing_ok=True)
        await remove_tree(self._layout.compute_confs(project_id))
        # Last: a retry after a crash still finds the user to end its processes.
        await self._users.remove(project_id)
        self._ready.discard(project_id)


def project_dir_for(project_dir: Path, run_as: RunAs) -> None:
    """``projects/<id>/`` root's, group the project's, 0710; its records root's alone."""
    with contextlib.suppress(FileExistsError):
        project_dir.mkdir(mode=PROJECT_DIR_MODE)
    st = project_dir.lstat()
    if st.st_gid != run_as.gid and run_as.switch:
        os.chown(project_dir, os.geteuid(), run_as.gid, follow_symlinks=False)
    if st.st_mode & 0o7777 != PROJECT_DIR_MODE:
        project_dir.chmod(PROJECT_DIR_MODE)
    ensure_dir(project_dir / "branches", 0o711)
    ensure_dir(project_dir / "endpoints", 0o700)


def hot(project_dir: Path) -> bool:
    """Whether the project's data is here, whole: its ``branches`` directory is made with its
    directory, and is the last thing a reattach puts in place."""
    return (project_dir / "branches").is_dir()


def ids(directory: Path) -> Iterator[str]:
    """Entries of ``directory`` that are valid ids (anything else was never ours)."""
    if not directory.is_dir():
        return
    for entry in sorted(directory.iterdir()):
        try:
            yield check_id("id", entry.name)
        except ComputeError:
            continue
