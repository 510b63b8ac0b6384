"""Expiring and annotated branches through ``neonctl`` 5.0.1 as users run it:
``branches create --expires-at``, ``branches set-expiration`` (to a time, and without one, which
removes it), ``--annotation`` (what create-branch-action v5 passed), and the list's table.

neonctl sends ``new Date(value).toISOString()`` (milliseconds, ``Z``) and prints what the API
answers; the platform keeps the second.
"""

from __future__ import annotations

from typing import Any

from pgplane.core import clock
from tests.neonctl import Neonctl
from tests.support import Api, wait_for

_US = 1_000_000


def _in(seconds: int) -> str:
    return clock.format_s(clock.now_us() + seconds * _US)


def _project(api: Api) -> str:
    return str(api.create_ready_project(name="previews")["project"]["id"])


def _settle(api: Api, pid: str) -> None:
    ops = api.wait_operations(pid, [o["id"] for o in api.operations(pid)])
    assert {o["status"] for o in ops} == {"finished"}, ops


def test_create_with_an_expiry_then_move_and_remove_it(neonctl: Neonctl, api: Api) -> None:
    pid = _project(api)
    at = _in(3600)
    out = neonctl.json(
        "branches", "create", "--project-id", pid, "--name", "preview", "--expires-at", at
    )
    branch: dict[str, Any] = out["branch"]
    assert branch["expires_at"] == at
    _settle(api, pid)
    shown = api.http.get(f"/projects/{pid}/branches/{branch['id']}").json()["branch"]
    assert shown["expires_at"] == at and 3590 <= shown["ttl_interval_seconds"] <= 3600

    later = _in(7200)
    moved = neonctl.json(
        "branches", "set-expiration", "preview", "--expires-at", later, "--project-id", pid
    )
    assert (moved["id"], moved["expires_at"]) == (branch["id"], later)
    table = neonctl.run("branches", "list", "--project-id", pid).stdout
    assert "never" in table  # main's column; the table reads annotations too

    cleared = neonctl.json("branches", "set-expiration", "preview", "--project-id", pid)
    assert "expires_at" not in cleared
    assert (
        "expires_at"
        not in api.http.get(f"/projects/{pid}/branches/{branch['id']}").json()["branch"]
    )

    # Refused with the platform's reason, which neonctl prints; nothing changes.
    done = neonctl.run(
        "branches",
        "set-expiration",
        "preview",
        "--expires-at",
        "2020-01-01T00:00:00Z",
        "--project-id",
        pid,
        check=False,
    )
    assert done.returncode == 1
    assert "expires_at must be in the future" in done.stderr, done.stderr
    done = neonctl.run(
        "branches",
        "set-expiration",
        "main",
        "--expires-at",
        later,
        "--project-id",
        pid,
        check=False,
    )
    assert done.returncode == 1 and "default branch cannot expire" in done.stderr, done.stderr
    listed = neonctl.json("branches", "list", "--project-id", pid)
    assert all("expires_at" not in b for b in listed), listed


def test_a_branch_neonctl_made_to_expire_is_gone_on_time(neonctl: Neonctl, api: Api) -> None:
    pid = _project(api)
    # Far enough ahead for node to start neonctl on a loaded machine (3.4 s was seen).
    out = neonctl.json(
        "branches", "create", "--project-id", pid, "--name", "ci-run", "--expires-at", _in(8)
    )
    bid = out["branch"]["id"]
    wait_for(
        "the branch deleted",
        lambda: api.http.get(f"/projects/{pid}/branches/{bid}").status_code == 404,
        60,
        server=api.server,
    )
    _settle(api, pid)
    names = [b["name"] for b in neonctl.json("branches", "list", "--project-id", pid)]
    assert names == ["main"]
    ops = neonctl.json("operations", "list", "--project-id", pid)
    assert [o["status"] for o in ops if o["action"] == "delete_timeline"] == ["finished"]


def test_an_annotated_branch_is_found_and_deleted_as_the_actions_do(
    neonctl: Neonctl, api: Api
) -> None:
    pid = _project(api)
    out = neonctl.json(
        "branches",
        "create",
        "--project-id",
        pid,
        "--name",
        "preview/pr-5",
        "--no-compute",
        "--annotation",
        '{"github-pr-number": "5", "github-commit-repo": "acme/shop"}',
    )
    bid = out["id"]
    _settle(api, pid)
    listed = api.http.get(f"/projects/{pid}/branches").json()
    assert listed["annotations"][bid]["value"] == {
        "github-pr-number": "5",
        "github-commit-repo": "acme/shop",
    }
    table = neonctl.run("branches", "list", "--project-id", pid).stdout
    assert "preview/pr-5" in table
    # delete-branch-action: neonctl resolves the name, then DELETE.
    neonctl.run("branches", "delete", "preview/pr-5", "--project-id", pid)
    _settle(api, pid)
    assert api.http.get(f"/projects/{pid}/branches").json()["annotations"] == {}
