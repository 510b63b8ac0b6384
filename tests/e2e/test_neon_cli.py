"""Neon's newest CLI, ``neon`` 6 (npm), as a team runs its workflow commands in a git
repository: ``link``, ``checkout``, ``status``, ``env pull``, ``init --project-id`` and the
``neon git`` post-checkout hook. What counts is that ``.env.local`` follows the branch: each
``DATABASE_URL`` it writes reaches that branch's data.

Features pgplane does not have (the AI Gateway's credentials, buckets, functions) are answered
as Neon's own clients read "not available here": ``env pull`` says so in a warning and writes
everything else, as it does on Neon for a project outside the regions that have them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import npm
from tests.support import Api, Server

NEON_VERSION = "6.2.3"
CACHE_DIR = npm.CACHE / "neon"


@pytest.fixture(scope="module")
def neon_bin() -> Path:
    """The directory holding the ``neon`` command (npm's ``.bin``), installed once."""
    prefix = npm.install(CACHE_DIR / NEON_VERSION, {"neon": NEON_VERSION})
    return prefix / "node_modules" / ".bin"


class Repo:
    """A scratch git repository, and ``neon`` run in it as its user would (CI: no prompts)."""

    def __init__(self, path: Path, neon_bin: Path, server: Server, api: Api) -> None:
        self.path = path
        home = path.parent / f"{path.name}-home"
        home.mkdir()
        path.mkdir()
        # The hook runs `neon` off PATH, and npm's shim runs `node` (the wheel's) off it.
        path = [str(neon_bin), str(Path(sys.executable).parent), os.environ["PATH"]]
        self.env = {
            **os.environ,
            "PATH": os.pathsep.join(path),
            "HOME": str(home),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "NEON_API_HOST": server.base_url,
            "NEON_API_KEY": api.key,
            "CI": "1",
            "GIT_AUTHOR_NAME": "pgplane", "GIT_AUTHOR_EMAIL": "tests@example.com",
            "GIT_COMMITTER_NAME": "pgplane", "GIT_COMMITTER_EMAIL": "tests@example.com",
        }  # fmt: skip
        self.run("git", "init", "-q", "-b", "main")
        self.run("git", "commit", "-q", "--allow-empty", "-m", "start")

    def _run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            argv, cwd=self.path, env=self.env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
        return done

    def run(self, *argv: str) -> str:
        """What it printed, on either stream (the CLI logs to stderr)."""
        done = self._run(*argv)
        return done.stdout + done.stderr

    def neon(self, *args: str) -> str:
        return self.run("neon", *args)

    def neon_json(self, *args: str) -> Any:
        return json.loads(self._run("neon", *args, "--output", "json").stdout)

    def env_local(self) -> dict[str, str]:
        pairs = (line.partition("=") for line in (self.path / ".env.local").read_text().split("\n"))
        return {k: v.strip('"') for k, _, v in pairs if k}


def _marker(url: str) -> Any:
    with psycopg.connect(url, connect_timeout=30) as conn:
        return conn.execute("select v from marker").fetchone()[0]  # type: ignore[index]


def test_env_local_follows_the_branch(
    neon_bin: Path, server: Server, api: Api, tmp_path: Path
) -> None:
    project = api.create_ready_project(name="neon-cli")
    pid = project["project"]["id"]
    with psycopg.connect(project["connection_uris"][0]["connection_uri"], autocommit=True) as c:
        c.execute("create table marker as select 'main' as v")
    repo = Repo(tmp_path / "app", neon_bin, server, api)

    out = repo.neon("link", "--project-id", pid, "-y")
    assert "branch:    main" in out, out
    linked = repo.env_local()
    assert linked["NEON_BRANCH"] == "main" and _marker(linked["DATABASE_URL"]) == "main"

    out = repo.neon("checkout", "dev", "--create")
    assert "Created branch dev" in out, out
    dev = repo.env_local()
    assert dev["NEON_BRANCH"] == "dev" and dev["DATABASE_URL"] != linked["DATABASE_URL"]
    with psycopg.connect(dev["DATABASE_URL"], connect_timeout=30, autocommit=True) as conn:
        conn.execute("update marker set v = 'dev'")
    assert _marker(linked["DATABASE_URL"]) == "main"  # a branch: main's data untouched
    assert '"name":"dev","parent":"main"' in repo.neon("status")

    out = repo.neon("env", "pull")
    assert "Pulled 3 Neon variables" in out and "does not exist on this platform" in out, out
    assert repo.env_local() == dev

    # The hook: a git checkout moves .env.local to the Neon branch of the same name.
    repo.neon("git", "install")
    repo.run("git", "checkout", "-q", "main")
    assert _marker(repo.env_local()["DATABASE_URL"]) == "main"
    repo.run("git", "checkout", "-q", "-b", "dev")
    assert repo.env_local()["NEON_BRANCH"] == "dev"
    assert _marker(repo.env_local()["DATABASE_URL"]) == "dev"
    mapped = repo.neon("git", "status").split()
    assert mapped[mapped.index("Mappings") + 1 :] == ["main", "→", "main", "dev", "→", "dev"]

    # Snapshots by slug (neon 6 looks them up by id, unique name, then slug).
    made = repo.neon_json(
        "snapshots", "create", "--branch", "main", "--name", "Before migration",
        "--slug", "before-migration",
    )  # fmt: skip
    got = repo.neon_json("snapshots", "get", "before-migration")
    assert got["id"] == made["id"] and got["slug"] == "before-migration", (made, got)

    # init links a fresh checkout of the app (and writes its neon.ts).
    fresh = Repo(tmp_path / "fresh", neon_bin, server, api)
    out = fresh.neon("init", "--project-id", pid, "--no-agent-setup", "-y")
    assert (fresh.path / "neon.ts").is_file(), out
    assert _marker(fresh.env_local()["DATABASE_URL"]) == "main"
