"""Finding Postgres installations: configuration, then PATH, then usual places, then pgserver.

Each candidate is a ``bin`` directory holding ``postgres`` and ``initdb``; its major version is
read from ``postgres --version``. The first directory found for a major serves it.
"""

from __future__ import annotations

import glob
import importlib.util
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

# Debian/Ubuntu, source builds, RHEL (PGDG), Homebrew (Apple silicon, Intel), Postgres.app.
_SYSTEM_GLOBS = (
    "/usr/lib/postgresql/*/bin",
    "/usr/local/pgsql/bin",
    "/usr/pgsql-*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
    "/opt/homebrew/opt/postgresql/bin",
    "/usr/local/opt/postgresql@*/bin",
    "/usr/local/opt/postgresql/bin",
    "/Applications/Postgres.app/Contents/Versions/*/bin",
)
_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")
_VERSION_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class PgInstall:
    """One Postgres installation: its major version, full version string and bin directory."""

    major: int
    version: str
    bin_dir: Path

    @property
    def postgres(self) -> Path:
        return self.bin_dir / "postgres"

    @property
    def initdb(self) -> Path:
        return self.bin_dir / "initdb"


def pgserver_bin_dir() -> Path | None:
    """The bin directory shipped in the pgserver wheel, found without importing pgserver."""
    # Importing pgserver emits warnings and starts nothing we need; its location is enough.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _candidates(configured: Sequence[Path], pgserver_only: bool) -> Iterator[Path]:
    if not pgserver_only:
        yield from configured
        on_path = shutil.which("postgres")
        if on_path is not None:
            # /usr/local/bin/postgres is often a symlink into the real installation, whose bin
            # directory (not /usr/local/bin) holds initdb and sits next to lib and share.
            yield Path(os.path.realpath(on_path)).parent
        for pattern in _SYSTEM_GLOBS:
            # Highest version first within a pattern, so "postgresql@16" precedes "@9".
            yield from (Path(p) for p in sorted(glob.glob(pattern), key=_natural, reverse=True))
    bundled = pgserver_bin_dir()
    if bundled is not None:
        yield bundled


def _natural(text: str) -> list[int | str]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def read_version(bin_dir: Path) -> PgInstall | None:
    """Probe one bin directory; None when it is not a usable Postgres installation."""
    postgres, initdb = bin_dir / "postgres", bin_dir / "initdb"
    if not all(os.access(p, os.X_OK) and p.is_file() for p in (postgres, initdb)):
        return None
    try:
        # Runs once per candidate at construction; `--version` is answered before the
        # refuse-to-run-as-root check, so it works for root too.
        out = subprocess.run(
            [str(postgres), "--version"],
            capture_output=True,
            text=True,
            timeout=_VERSION_TIMEOUT,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.debug("skipping %s: %s", bin_dir, exc)
        return None
    match = _VERSION.search(out)
    if match is None:
        log.debug("skipping %s: unrecognised version %r", bin_dir, out)
        return None
    return PgInstall(major=int(match.group(1)), version=out.strip(), bin_dir=bin_dir)


def discover(configured: Sequence[Path], *, pgserver_only: bool = False) -> dict[int, PgInstall]:
    """Map each available major version to the first installation found for it."""
    found: dict[int, PgInstall] = {}
    seen: set[Path] = set()
    for candidate in _candidates(configured, pgserver_only):
        bin_dir = Path(os.path.realpath(candidate))
        if bin_dir in seen:
            continue
        seen.add(bin_dir)
        install = read_version(bin_dir)
        if install is not None and install.major not in found:
            log.debug("found %s in %s", install.version, bin_dir)
            found[install.major] = install
    if not found:
        log.warning("no Postgres found in configuration, PATH, usual places or the pgserver wheel")
    return dict(sorted(found.items()))
