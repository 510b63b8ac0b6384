"""The branch size limit on this machine's computes: its library per major, and its value.

Each endpoint's postmaster preloads the library built for its major (``-c
shared_preload_libraries=…``, the endpoint's own libraries kept before it) and reads its
configuration from a file of the platform's (``-c config_file=…``, root's, read-only in the
sandbox): the cluster's own ``postgresql.conf``, then ``conf/limits/size-limit.conf``, which sets
``pgplane.max_cluster_size``. Both are on the command line, so ``ALTER SYSTEM`` cannot undo
them; the value is in a file, not on the command line, because a ``-c`` outranks every file
at a reload and the limit must change without a restart: ``serve`` rewrites that one file when
its setting changed and sends each running compute SIGHUP, as ``pg_ctl reload`` does. The
extension's variable is PGC_SIGHUP: no ``SET``, ``ALTER ROLE`` or ``ALTER DATABASE`` reaches it.

A tenant holding its compute's OS user (DESIGN §6) can write ``postgresql.auto.conf``, read
after both, or its relation files directly: the limit holds a tenant's SQL; the disk walls
hold the rest.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.layout import Layout, ensure_dir
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.limits.library import (
    Toolchain,
    Unbuildable,
    build,
    toolchain,
)
from pgplane.telemetry import progress

log = logging.getLogger(__name__)

GUC = "pgplane.max_cluster_size"
_PRELOAD = "shared_preload_libraries"


class SizeLimit:
    """The limit every compute enforces (MiB; 0: none) and the library that enforces it."""

    def __init__(
        self,
        layout: Layout,
        limit_mib: int,
        installs: Mapping[int, PgInstall],
        env: Mapping[str, str] = os.environ,
    ) -> None:
        self._layout = layout
        self.limit_mib = limit_mib
        self._installs = dict(installs)
        self._env = env
        self._toolchains: dict[int, Toolchain] | None = None
        self._checking = asyncio.Lock()  # two computes starting at once check once
        self._builds: dict[int, asyncio.Task[Path | None]] = {}
        self._written: set[Path] = set()  # compute configuration files written by this process

    def check(self) -> None:
        """Find each major's compiler and headers, and say once which majors go without."""
        if self._toolchains is not None:
            return
        found: dict[int, Toolchain] = {}
        for major, install in self._installs.items():
            try:
                found[major] = toolchain(install, self._env)
            except Unbuildable as exc:
                log.warning("Postgres %d computes have no branch size limit: %s", major, exc)
        self._toolchains = found

    async def start(self) -> None:
        """Start building every major's library (off the event loop), to be ready by the
        first compute's start; a restart on the same data directory finds them built."""
        async with self._checking:
            await asyncio.to_thread(self.check)
        for major in self._toolchains or {}:
            self._task(major)

    async def library(self, major: int) -> Path | None:
        """The library for ``major``, built if need be; None where it cannot be."""
        if self._toolchains is None:
            async with self._checking:
                await asyncio.to_thread(self.check)
        if major not in (self._toolchains or {}):
            return None
        # Shielded: a compute start given up on must not cancel a build others wait for.
        return await asyncio.shield(self._task(major))

    def _task(self, major: int) -> asyncio.Task[Path | None]:
        if major not in self._builds:
            self._builds[major] = asyncio.create_task(self._build(major), name=f"build {major}")
        return self._builds[major]

    async def _build(self, major: int) -> Path | None:
        assert self._toolchains is not None  # noqa: S101 - check() ran before any task
        install, tools = self._installs[major], self._toolchains[major]
        directory = self._layout.extensions
        started = asyncio.get_running_loop().time()
        try:
            await asyncio.to_thread(ensure_dir, directory, 0o755)
            with progress.step(log, f"building the size-limit library for Postgres {major}"):
                path, built = await asyncio.to_thread(build, install, directory, tools)
        except (Unbuildable, OSError) as exc:
            log.warning("Postgres %d computes have no branch size limit: %s", major, exc)
            return None
        if built:
            elapsed = (asyncio.get_running_loop().time() - started) * 1000
            log.info("built the size-limit library for Postgres %d in %.0f ms", major, elapsed)
        return path

    async def apply(self, reload: Callable[[], int]) -> None:
        """At start-up: start the builds, and when the limit changed, write it and ``reload``
        the running computes (blocking: run off the loop) so they take it without a restart."""
        await self.start()
        try:
            if not await asyncio.to_thread(self.write_value):
                return
            signalled = await asyncio.to_thread(reload)
        except OSError as exc:  # never fails start-up: computes then start as they can
            log.warning("branch size limit not applied: %s", exc)
            return
        said = f"{self.limit_mib} MiB" if self.limit_mib > 0 else "none"
        log.info("branch size limit: %s (given to %d running computes)", said, signalled)

    @staticmethod
    def readable(layout: Layout) -> list[Path]:
        """What every sandbox must show: the limit's directory and the built libraries."""
        return [layout.size_limit_conf.parent, layout.extensions]

    def guc_value(self) -> int:
        return self.limit_mib if self.limit_mib > 0 else -1

    def write_value(self) -> bool:
        """Make ``conf/limits/size-limit.conf`` say the limit; True when it changed."""
        path = self._layout.size_limit_conf
        data = f"# Written by pgplane (--branch-size-limit).\n{GUC} = {self.guc_value()}\n"
        ensure_dir(path.parent.parent, 0o755)
        ensure_dir(path.parent, 0o755)
        try:
            if path.read_bytes() == data.encode():  # root's: conf/
                return False
        except FileNotFoundError:
            pass
        write_atomic(path, data.encode(), mode=0o644)
        path.chmod(0o644)  # whatever the umask made of it
        return True

    async def settings(
        self,
        library: Path,
        project_id: str,
        branch_id: str,
        settings: Mapping[str, str],
    ) -> dict[str, str]:
        """``settings`` with the library preloaded (after the endpoint's own) and the compute's
        configuration file, written first unless this process wrote it already."""
        conf = self._layout.compute_conf(project_id, branch_id)
        # A wake comes here: the file is written (off the loop) once per branch and process.
        if conf not in self._written or not conf.is_file():
            await asyncio.to_thread(self._write_conf, conf, project_id, branch_id)
            self._written.add(conf)
        merged = {k: v for k, v in settings.items() if k.lower() != _PRELOAD}
        own = [v for k, v in settings.items() if k.lower() == _PRELOAD and v.strip()]
        merged[_PRELOAD] = ",".join([*own, _list_item(str(library))])
        merged["config_file"] = str(conf)
        return merged

    def _write_conf(self, conf: Path, project_id: str, branch_id: str) -> None:
        pgdata = self._layout.pgdata(project_id, branch_id)
        text = (
            "# Written by pgplane: the cluster's own configuration, then the platform's limit.\n"
            f"include_if_exists {_quote(str(pgdata / 'postgresql.conf'))}\n"
            f"include {_quote(str(self._layout.size_limit_conf))}\n"
        )
        ensure_dir(conf.parent.parent, 0o711)  # passed through by compute users, never listed
        ensure_dir(conf.parent, 0o711)
        try:
            current = conf.read_bytes()  # root's: conf/computes/
        except FileNotFoundError:
            current = None
        if current != text.encode():
            write_atomic(conf, text.encode(), mode=0o644)
            conf.chmod(0o644)


def config_files(argv: Sequence[str]) -> list[Path]:
    """The configuration file a postmaster's command line names (its sandbox must show it)."""
    return [Path(a.split("=", 1)[1]) for a in argv if a.startswith("config_file=")]


def _quote(value: str) -> str:
    """A string as postgresql.conf quotes it."""
    return "'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _list_item(value: str) -> str:
    """One item of a list setting, quoted where a comma or space would split it."""
    if any(c in value for c in ', \t"'):
        return '"' + value.replace('"', '""') + '"'
    return value
