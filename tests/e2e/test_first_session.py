"""The first session as README.md and docs/getting-started.md give it, run word for word in
bash (only the API's address changed: the test's server has a port of its own), beside a
running ``serve``, with this machine's lack of Postgres (CI hides the system's): a key from the
command line, a project from curl, and a query through ``pgplane psql``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.support import running_server

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- first-session -->\n```sh\n(.*?)```", re.DOTALL)


def _first_session(path: Path) -> str:
    found = _BLOCK.search(path.read_text())
    assert found, f"{path} has no first session"
    return found.group(1)


def test_the_readme_and_getting_started_give_one_first_session() -> None:
    assert _first_session(ROOT / "README.md") == _first_session(ROOT / "docs/getting-started.md")


def test_the_first_session_runs_as_written(tmp_path: Path) -> None:
    state = str(tmp_path / "state")  # where serve notes its data directory for the CLI
    with running_server(XDG_STATE_HOME=state) as server:
        script = _first_session(ROOT / "README.md")
        assert "127.0.0.1:8080" in script
        script = script.replace("127.0.0.1:8080", f"127.0.0.1:{server.port}")
        (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
        env = {k: v for k, v in os.environ.items() if k != "PGPLANE_DATA_DIR"}
        env |= {"HOME": str(tmp_path), "XDG_STATE_HOME": state}
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PostgreSQL 18" in done.stdout, done.stdout
