"""Postgres 15 for the suites of older majors, on a machine that has none.

A fresh machine has no system Postgres; the platform serves the wheel's 18 there, and the
suites of majors 15 and older (their CREATEROLE warning, schema-only branches of a 15 project)
would have nothing to run on. Debian's own packages are unpacked for them instead (``apt-get
download`` and ``dpkg -x``, nothing installed), with the libraries they load that the machine
lacks (libpq always: a machine without Postgres has none), each binary told where those are
(``patchelf``: an ``$ORIGIN``-relative RUNPATH, which the loader reads before its cache).

Where they go: as root, under ``/usr/local/lib`` (``0755``): each compute runs as an OS user
of its own, in a sandbox that sees the OS's ``/usr`` read-only, and Debian's layout keeps
``share/`` beside ``lib/`` rather than under the installation, so only a tree inside ``/usr``
is whole in there. As an ordinary user, the computes run as that user, unsandboxed: the user's
cache. The tests then find it as ``pgplane serve`` does, through ``PGPLANE_PG_BIN_DIRS``.
"""

from __future__ import annotations

import fcntl
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MAJOR = 15
_ROOT_CACHE = Path("/usr/local/lib/pgplane-tests")
_USER_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pgplane-tests"
_TIMEOUT = 300
why_not = ""  # why no Postgres 15 could be had, for the suites' skip reasons


class Unavailable(Exception):
    """Debian's packages could not be had here (no apt, no such package, no network)."""


def cache_root() -> Path:
    return (_ROOT_CACHE if os.geteuid() == 0 else _USER_CACHE) / f"postgresql-{MAJOR}"


def bin_dir(root: Path) -> Path:
    return root / "usr" / "lib" / "postgresql" / str(MAJOR) / "bin"


def ensure() -> Path:
    """The bin directory of an unpacked, runnable Postgres 15 (made on first call)."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        raise Unavailable("no apt-get or dpkg on this machine")
    root = cache_root()
    root.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(root.parent, 0o755)  # noqa: S103 - the compute users run what is in it
    # Both xdist workers (and a second session) may get here at once: one unpacks.
    with open(root.parent / f".postgresql-{MAJOR}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / ".complete").exists():
            _unpack_all(root)
    return bin_dir(root)


def _unpack_all(root: Path) -> None:
    tmp = root.with_name(f".{root.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    packages = [f"postgresql-{MAJOR}", f"postgresql-client-{MAJOR}", "libpq5"]
    _unpack([*packages, *_absent_libraries()], tmp)
    _point_at_own_libraries(tmp)
    _open_to_all(tmp)
    (tmp / ".complete").touch()
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)


def _run(argv: list[str], **kwargs: object) -> str:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=_TIMEOUT, check=True, **kwargs
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise Unavailable(f"{' '.join(argv[:3])}: {str(detail).strip()[-300:]}") from None
    return done.stdout


def _unpack(packages: list[str], into: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="pgplane-tests-deb-") as tmp:
        _run(["apt-get", "download", "-q", *packages], cwd=tmp)
        for deb in sorted(glob.glob(f"{tmp}/*.deb")):
            _run(["dpkg", "-x", deb, str(into)])


def _libdir(root: Path) -> Path:
    found = sorted(root.glob("usr/lib/*-linux-gnu"))
    if not found:
        raise Unavailable(f"no multiarch library directory in {root}")
    return found[0]


def _elf_files(root: Path) -> list[Path]:
    candidates = [*bin_dir(root).iterdir(), *root.glob(f"usr/lib/postgresql/{MAJOR}/lib/*.so")]
    candidates += [p for p in _libdir(root).glob("*.so*") if not p.is_symlink()]
    return [p for p in candidates if p.is_file() and _is_elf(p)]


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == b"\x7fELF"


def _missing_sonames(root: Path) -> set[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(_libdir(root))}
    missing: set[str] = set()
    for path in _elf_files(root):
        if path.name == "llvmjit.so":
            continue  # JIT: left out below if LLVM is not here
        out = subprocess.run(
            ["ldd", str(path)], capture_output=True, text=True, env=env, check=False
        ).stdout
        missing |= {line.split()[0] for line in out.splitlines() if "not found" in line}
    return missing


def _absent_libraries() -> list[str]:
    """The library packages Postgres needs that the machine does not have installed.

    Which package ships a library is known to dpkg only for installed ones, so the search
    goes the other way: every library in the dependency closure of Postgres' packages that
    is not installed (libicu or libxml2 on a fresh machine). LLVM (hundreds of megabytes,
    only for JIT) is left out.
    """
    closure = _run(
        [
            "apt-cache",
            "depends",
            "--recurse",
            "--no-recommends",
            "--no-suggests",
            "--no-conflicts",
            "--no-breaks",
            "--no-replaces",
            "--no-enhances",
            f"postgresql-{MAJOR}",
            f"postgresql-client-{MAJOR}",
        ]
    )
    names = sorted(
        {line for line in closure.splitlines() if re.fullmatch(r"lib[a-z0-9.+-]+", line)}
        - {"libpq5"}
    )
    names = [n for n in names if not n.startswith("libllvm")]
    status = subprocess.run(
        ["dpkg-query", "-W", "-f=${db:Status-Abbrev} ${Package}\\n", *names],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    installed = {line.split()[-1] for line in status.splitlines() if line.startswith("ii")}
    return [n for n in names if n not in installed]


def _point_at_own_libraries(root: Path) -> None:
    patchelf = Path(sys.executable).parent / "patchelf"
    if not patchelf.exists():
        found = shutil.which("patchelf")
        if found is None:
            raise Unavailable("no patchelf (a test dependency)")
        patchelf = Path(found)
    libdir = _libdir(root)
    if _missing_sonames(root):
        raise Unavailable(f"libraries still missing: {sorted(_missing_sonames(root))}")
    jit = root / "usr" / "lib" / "postgresql" / str(MAJOR) / "lib" / "llvmjit.so"
    if jit.exists() and "not found" in _run(["ldd", str(jit)]):
        # Postgres runs without JIT when its provider is absent, and fails when it is
        # present but cannot load (LLVM is hundreds of megabytes: not fetched for this).
        jit.unlink()
    for path in _elf_files(root):
        rel = os.path.relpath(libdir, path.parent)
        runpath = "$ORIGIN" if rel == "." else f"$ORIGIN/{rel}"
        _run([str(patchelf), "--set-rpath", runpath, str(path)])


def _open_to_all(root: Path) -> None:
    """Anyone may read and run the tree (the compute users), only root may change it."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            if path.is_symlink():
                continue
            mode = path.stat().st_mode & 0o777
            mode |= 0o444
            if path.is_dir() or mode & 0o100:
                mode |= 0o111
            path.chmod(mode & ~0o022)
    root.chmod(0o755)
