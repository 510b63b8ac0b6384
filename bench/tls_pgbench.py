"""A ``pgbench`` with TLS for the benchmarks' TLS sides: the bundled wheel's is built without it.

Debian's own, unpacked from its ``postgresql-<major>`` package (``apt-get download`` and
``dpkg -x`` into a cache directory, nothing installed), with Debian's libpq beside it when the
machine has none. None where apt is not there to ask.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pgplane-bench"


def _unpack(package: str, into: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="pgplane-bench-deb-") as tmp:
        subprocess.run(
            ["apt-get", "download", "-q", package], cwd=tmp, capture_output=True, check=True
        )
        (deb,) = glob.glob(f"{tmp}/*.deb")
        subprocess.run(["dpkg", "-x", deb, str(into)], check=True)


def _works(pgbench: Path, env: dict[str, str]) -> bool:
    probe = subprocess.run(
        [str(pgbench), "-n", "-c", "1", "-t", "1", "host=/nonexistent sslmode=require"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
        check=False,
    )
    return "not compiled in" not in probe.stderr and "error while loading" not in probe.stderr


def tls_pgbench(major: int = 15) -> tuple[str, dict[str, str]] | None:
    """The path of a TLS-capable pgbench and the environment it runs with; None if not had."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return None
    root = CACHE / f"postgresql-{major}"
    pgbench = root / "usr" / "lib" / "postgresql" / str(major) / "bin" / "pgbench"
    env = {**os.environ, "LD_LIBRARY_PATH": str(root / "usr" / "lib" / "x86_64-linux-gnu")}
    if pgbench.is_file() and _works(pgbench, env):
        return str(pgbench), env
    try:
        root.mkdir(parents=True, exist_ok=True)
        _unpack(f"postgresql-{major}", root)
        if not _works(pgbench, env):
            _unpack("libpq5", root)
    except (subprocess.CalledProcessError, ValueError) as exc:
        print(f"no TLS pgbench: {exc}")
        return None
    return (str(pgbench), env) if _works(pgbench, env) else None
