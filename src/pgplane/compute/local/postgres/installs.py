"""The Postgres installations the driver serves: discovery, relocation, templates, settings.

Everything here is shared by all projects and holds no tenant data, so it runs as the shared
compute user: the installation as it can run it (copied out of a root-only place if need be),
the per-version template (initdb output every new cluster is copied from) and ``postgres -C``
checks of endpoint settings against that template's configuration.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.binaries import PgInstall, discover
from pgplane.compute.local.postgres.cluster import ensure_template, template_pgdata
from pgplane.compute.local.postgres.command import validate_settings
from pgplane.compute.local.postgres.relocate import runnable_install
from pgplane.compute.local.tenants.user import RunAs

_ACCEPTED_MAX = 10_000


class Installs:
    """Installations by major version, made runnable and given a template on first use."""

    def __init__(
        self,
        layout: Layout,
        pg_bin_dirs: Sequence[Path],
        *,
        bundled_only: bool,
        shared_user: Callable[[], Awaitable[RunAs]],
    ) -> None:
        self._layout = layout
        # Probing runs `postgres --version` once per candidate: a few ms, once per process.
        self._found = discover(pg_bin_dirs, bundled_only=bundled_only)
        self._shared_user = shared_user
        self._runnable: dict[int, PgInstall] = {}
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._accepted: set[tuple[int, str, str]] = set()  # (major, name, value) Postgres took

    def versions(self) -> list[int]:
        return list(self._found)

    def found(self, major: int) -> PgInstall:
        """The installation found for a major version (before any relocation)."""
        install = self._found.get(major)
        if install is None:
            available = ", ".join(map(str, self._found)) or "none"
            raise ComputeError(f"Postgres {major} is not available (available: {available})")
        return install

    def template(self, major: int) -> Path:
        """The template's data directory (exists once :meth:`runnable` returned)."""
        return template_pgdata(self._layout.template(major))

    async def runnable(self, major: int) -> PgInstall:
        """The installation as compute users run it, with its template built."""
        if major not in self._runnable:
            async with self._locks[major]:
                if major not in self._runnable:
                    shared = await self._shared_user()
                    install = await runnable_install(
                        self.found(major), shared, self._layout.install_copy(major)
                    )
                    await ensure_template(install, shared, self._layout.template(major))
                    self._runnable[major] = install
        return self._runnable[major]

    async def check_settings(self, major: int, settings: Mapping[str, str]) -> None:
        """Raise InvalidSettings unless Postgres ``major`` takes every value."""
        # Postgres is asked once per value: a setting it took stays valid for its binaries.
        unknown = {n: v for n, v in settings.items() if (major, n, v) not in self._accepted}
        if not unknown:
            return
        install = await self.runnable(major)
        await validate_settings(install, await self._shared_user(), self.template(major), unknown)
        if len(self._accepted) > _ACCEPTED_MAX:
            self._accepted.clear()
        self._accepted.update((major, n, v) for n, v in unknown.items())
