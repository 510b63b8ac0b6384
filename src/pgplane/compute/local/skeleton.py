"""The data directory's skeleton, made (or mended) once per process, before anything uses it.

The shared compute user, the directories every compute passes through or reads (with the modes
layout.py gives them), every project's filesystem mounted on its directory, and what a crash
left half removed finished.
"""

from __future__ import annotations

import asyncio
import contextlib

from pgplane.compute.local.copies.spares import SparePool
from pgplane.compute.local.files import sweep_trash
from pgplane.compute.local.layout import Layout, ensure_dir, ensure_private_dir
from pgplane.compute.local.postgres.hba import write_hba
from pgplane.compute.local.postgres.limits.size_limit import SizeLimit
from pgplane.compute.local.tenants.projects import ids
from pgplane.compute.local.tenants.user import RunAs, open_traversal
from pgplane.compute.local.tenants.users import ComputeUsers
from pgplane.compute.local.tenants.volumes import Volumes


class Skeleton:
    def __init__(
        self,
        *,
        layout: Layout,
        users: ComputeUsers,
        spares: SparePool,
        volumes: Volumes,
        size_limit: SizeLimit,
    ) -> None:
        self._layout = layout
        self._users = users
        self._spares = spares
        self._volumes = volumes
        self._size_limit = size_limit
        self._lock = asyncio.Lock()
        self._ready = False

    async def prepare(self) -> RunAs:
        """The shared compute user, once the skeleton is there."""
        shared = await self._users.shared()
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self._make(shared)
                    self._ready = True
        return shared

    def tidy(self) -> None:
        """At close: /tmp tidied when no endpoint uses the fallback socket root any more."""
        run_root = self._layout.run_root
        if not run_root.is_relative_to(self._layout.data_dir):
            with contextlib.suppress(OSError):
                run_root.rmdir()

    async def _make(self, shared: RunAs) -> None:
        layout = self._layout
        await asyncio.to_thread(self._make_dirs, shared)
        # Before anything reads a project: its files are on its filesystem.
        await asyncio.to_thread(self._volumes.mount_all, layout.projects)
        await sweep_trash(layout.projects)
        await sweep_trash(layout.archives)
        for project_id in ids(layout.projects):  # a reset's old data
            for branch_id in ids(layout.project_dir(project_id) / "branches"):
                await sweep_trash(layout.branch_dir(project_id, branch_id))

    def _make_dirs(self, shared: RunAs) -> None:
        layout = self._layout
        if not layout.data_dir.exists():
            ensure_dir(layout.data_dir)
        if shared.switch:
            # Compute users pass through it (to their own 0700 directories), never list it.
            ensure_dir(layout.data_dir, 0o711)
        open_traversal(layout.data_dir, shared)
        for directory in (layout.projects, layout.templates):
            ensure_dir(directory)
        self._spares.adopt()
        ensure_dir(layout.installs, 0o755)
        write_hba(layout.hba_file)
        ensure_dir(layout.extensions, 0o755)
        self._size_limit.write_value()  # every sandbox mounts it: there before any start
        ensure_dir(layout.logs, 0o700)
        if layout.run_root.is_relative_to(layout.data_dir):
            ensure_dir(layout.run_root)
        else:
            ensure_private_dir(layout.run_root)
