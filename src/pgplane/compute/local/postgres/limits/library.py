"""Building the size-limit library for one Postgres installation, once per source and version.

Vanilla Postgres has no hook where Neon enforces its size limit (extending a relation's file),
so pgplane ships a small C library, ``pgplane_limits.c`` beside this module, and compiles it
against each served installation's server headers with the machine's C compiler (``CC``, else
``cc`` or ``gcc``). Where either is missing, that major's computes run without it.

The compiler runs as root, so everything it reads or writes is root's: the source (this
package), the installation's headers (found by its own ``pg_config``), a fresh private
directory (``mkdtemp``, 0700) inside ``extensions/`` (root's, 0755) to build in, never a path a
tenant can write. The result is renamed into place, so a compute never loads half a file. It is
named by a hash of the source, the installation's version and its header directory: a rebuild
happens only when one of them changes (a new pgplane, a new minor), and a restart on the same
data directory finds it built.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.local.files import fsync_dir
from pgplane.compute.local.postgres.binaries import PgInstall

SOURCE = Path(__file__).with_name("pgplane_limits.c")
NAME = "pgplane_limits"
_PG_CONFIG_TIMEOUT = 10.0
_BUILD_TIMEOUT = 120.0


class Unbuildable(Exception):
    """The library cannot be built for an installation; the message says why."""


@dataclass(frozen=True, slots=True)
class Toolchain:
    """What one installation's build needs: a compiler and its server headers."""

    compiler: tuple[str, ...]
    includes: Path


def find_compiler(env: Mapping[str, str]) -> tuple[str, ...] | None:
    """``CC`` (which may carry flags, as make allows), else ``cc`` or ``gcc`` on PATH."""
    try:
        given = shlex.split(env.get("CC", ""))
    except ValueError:  # unbalanced quotes: make would not run it either
        return None
    if given:
        found = shutil.which(given[0], path=env.get("PATH"))
        return (found, *given[1:]) if found is not None else None
    for name in ("cc", "gcc"):
        found = shutil.which(name, path=env.get("PATH"))
        if found is not None:
            return (found,)
    return None


def server_includes(install: PgInstall) -> Path:
    """The installation's server header directory, asked of its own ``pg_config``."""
    pg_config = install.bin_dir / "pg_config"
    if not os.access(pg_config, os.X_OK):
        raise Unbuildable(f"no pg_config in {install.bin_dir}")
    try:
        out = subprocess.run(
            [str(pg_config), "--includedir-server"],
            capture_output=True,
            text=True,
            timeout=_PG_CONFIG_TIMEOUT,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        raise Unbuildable(f"{pg_config} failed: {exc}") from None
    includes = Path(out)
    if not (includes / "postgres.h").is_file():
        hint = f" (Debian: apt install postgresql-server-dev-{install.major})"
        raise Unbuildable(
            f"no server headers in {includes}{hint if out.startswith('/usr') else ''}"
        )
    return includes


def toolchain(install: PgInstall, env: Mapping[str, str] = os.environ) -> Toolchain:
    """The compiler and headers for ``install``; Unbuildable says which is missing."""
    compiler = find_compiler(env)
    if compiler is None:
        raise Unbuildable("no C compiler (set CC, or install gcc)")
    return Toolchain(compiler, server_includes(install))


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)  # root's: our own build directory
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def library_path(directory: Path, install: PgInstall, includes: Path) -> Path:
    """Where the library built from this source for ``install`` lives."""
    digest = hashlib.sha256(SOURCE.read_bytes())  # root's: this package
    digest.update(f"\0{install.version}\0{includes}".encode())
    return directory / f"{NAME}-{install.major}-{digest.hexdigest()[:16]}.so"


def build(install: PgInstall, directory: Path, tools: Toolchain) -> tuple[Path, bool]:
    """The library for ``install`` in ``directory`` (root's), and whether it was built now
    (False: found built). Blocking: run it off the event loop."""
    target = library_path(directory, install, tools.includes)
    if target.is_file():
        return target, False
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=directory))
    try:
        out = work / target.name
        shared = ["-bundle", "-undefined", "dynamic_lookup"] if sys.platform == "darwin" else []
        argv = [*tools.compiler, "-O2", "-fPIC", *(shared or ["-shared"])]
        argv += ["-I", str(tools.includes), "-o", str(out), str(SOURCE)]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=_BUILD_TIMEOUT, check=False
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise Unbuildable(f"{tools.compiler[0]} failed: {exc}") from None
        if done.returncode != 0:
            raise Unbuildable(f"{tools.compiler[0]} failed: {done.stderr.strip()[-500:]}")
        out.chmod(0o644)
        fsync_file(out)  # a crash must not leave an empty file that is taken for built
        os.replace(out, target)
        fsync_dir(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target, True
