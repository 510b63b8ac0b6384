"""The command line on a data directory (headless installs): keys for the account that signs in
to the console, listed and revoked; accounts listed; long commands say what they are doing."""

from __future__ import annotations

import json
import os
import selectors
import sqlite3
import subprocess
import time
from pathlib import Path

import httpx

from tests.console import PASSWORD, Browser
from tests.support import PGPLANE, Api, run_cli, running_server


def test_the_headless_key_is_the_console_accounts_and_keys_are_listed_and_revoked() -> None:
    with running_server() as server:
        made = run_cli(
            "accounts", "create", "alice@example.com", "--password-stdin",
            data_dir=server.data_dir, stdin=f"{PASSWORD}\n",
        )  # fmt: skip
        assert made.returncode == 0, made.stderr
        # No --account: the platform's only account, the one that signs in.
        done = run_cli("api-keys", "create", "--name", "ci", data_dir=server.data_dir)
        assert done.returncode == 0, done.stderr
        key = json.loads(done.stdout)
        headers = {"Authorization": f"Bearer {key['key']}"}
        r = httpx.post(
            f"{server.base_url}/projects",
            json={"project": {"name": "made-headless"}},
            headers=headers,
        )
        assert r.status_code == 201, r.text
        with Browser(server) as browser:
            assert browser.sign_in("alice@example.com").status_code == 303
            assert "made-headless" in browser.get("/console/projects").text

        accounts = json.loads(run_cli("accounts", "list", data_dir=server.data_dir).stdout)
        assert [(a["email"], a["console_sign_in"]) for a in accounts] == [
            ("alice@example.com", True)
        ]
        listed = json.loads(run_cli("api-keys", "list", data_dir=server.data_dir).stdout)
        assert [(k["id"], k["name"]) for k in listed] == [(key["id"], "ci")]
        assert "key" not in listed[0]  # the value is never shown again

        revoked = run_cli("api-keys", "revoke", str(key["id"]), data_dir=server.data_dir)
        assert revoked.returncode == 0, revoked.stderr
        assert httpx.get(f"{server.base_url}/projects", headers=headers).status_code == 401
        assert run_cli("api-keys", "revoke", "999", data_dir=server.data_dir).returncode == 2

        # With two accounts, a key must say whose it is.
        run_cli("api-keys", "create", "--name", "b", "--account", "bob@example.com",
                data_dir=server.data_dir)  # fmt: skip
        unnamed = run_cli("api-keys", "create", "--name", "x", data_dir=server.data_dir)
        assert unnamed.returncode == 2
        assert "several accounts: name one with --account" in unnamed.stderr


def test_help_is_whole_at_80_columns() -> None:
    for command in (
        ["--help"],
        ["serve", "--help"],
        ["api-keys", "--help"],
        ["accounts", "--help"],
        ["store", "copy", "--help"],
    ):
        done = subprocess.run(
            [*PGPLANE, *command],
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "80"},
            check=True,
        )
        assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
        assert "…" not in done.stdout.replace("ep-….<", "")  # no name cut short
        if command[0] == "serve":
            assert "--proxy-wildcard-dns / --no-proxy-wildcard-dns" in done.stdout


def _until_said(process: subprocess.Popen[str], needle: str, said: list[str]) -> None:
    """Read ``process``' stderr into ``said`` until a line holds ``needle`` (60 s at most)."""
    assert process.stderr is not None
    deadline = time.monotonic() + 60
    with selectors.DefaultSelector() as sel:
        sel.register(process.stderr, selectors.EVENT_READ)
        while not any(needle in line for line in said):
            left = deadline - time.monotonic()
            assert left > 0 and process.poll() is None, (needle, said)
            if sel.select(timeout=min(left, 1.0)):
                said.append(process.stderr.readline())


def test_a_command_waiting_for_the_store_says_so_and_goes_on_when_it_is_free(
    tmp_path: Path,
) -> None:
    first = run_cli("accounts", "list", data_dir=tmp_path)  # makes the store
    assert first.returncode == 0, first.stderr
    assert "applying store migration 0001_initial.sql" in first.stderr  # what it did, said
    quick = run_cli("accounts", "list", data_dir=tmp_path)
    assert (quick.returncode, quick.stderr) == (0, "")  # nothing slow: nothing said

    # Another process (a busy serve, here this test) holds the store's write lock.
    holder = sqlite3.connect(tmp_path / "pgplane.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    process = subprocess.Popen(
        [*PGPLANE, "api-keys", "create", "--name", "ci", "--data-dir", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    try:
        _until_said(process, "the store is locked by another process: waiting up to 60 s", said)
        _until_said(process, "waiting for the store's write lock ...", said)  # past a second
    except BaseException:
        process.kill()
        raise
    finally:
        holder.execute("COMMIT")
        holder.close()
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, (said, err)
    assert json.loads(out)["name"] == "ci"
    assert "waiting for the store's write lock: done after" in err, (said, err)


def test_serve_says_what_it_does_while_it_suspends_the_computes_at_a_stop() -> None:
    # The suspend takes 2.5 s (a checkpoint of a busy compute, say): long enough to be told.
    slow = "before:suspend_compute=1*sleep(2500)"
    with running_server(PGPLANE_STOP_COMPUTES="on", PGPLANE_FAILPOINTS=slow) as server:
        _, key = server.create_key("progress@example.com")
        with Api(server, key) as api:
            api.create_ready_project()
        server.stop()
        log = server.log()
    step = "suspending the running computes before stopping"
    said = [line for line in log.splitlines() if step in line]
    assert len(said) == 2 and said[0].endswith(f"{step} ..."), log[-3000:]
    assert f"{step}: done after" in said[1]
    assert log.index(said[1]) < log.index("pgplane stopped")


def _cli_without_data_dir(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a person runs it beside a server: no --data-dir, no PGPLANE_DATA_DIR."""
    env = {k: v for k, v in os.environ.items() if k != "PGPLANE_DATA_DIR"}
    env |= {"HOME": str(home), "XDG_STATE_HOME": str(home / "state")}
    return subprocess.run(
        [*PGPLANE, *args], capture_output=True, text=True, timeout=60, check=False, env=env
    )


def test_without_data_dir_the_cli_finds_the_running_platform_and_never_makes_a_store(
    tmp_path: Path,
) -> None:
    """A newcomer's `pgplane api-keys create` beside a `serve` on another data directory made
    a second, empty store in the home directory, whose key the server refused (401). It finds
    the running platform now; with none running and none at the default, or several running,
    it says which --data-dir to give, and makes nothing."""
    default = tmp_path / ".local" / "share" / "pgplane"
    state = {"XDG_STATE_HOME": str(tmp_path / "state")}
    with running_server(**state) as server:
        done = _cli_without_data_dir(tmp_path, "api-keys", "create", "--name", "first")
        assert done.returncode == 0, done.stderr
        assert f"the data directory of the running serve: {server.data_dir}" in done.stderr
        key = json.loads(done.stdout)["key"]
        with Api(server, key) as api:
            assert api.http.get("/projects").status_code == 200
        with running_server(**state) as second:
            done = _cli_without_data_dir(tmp_path, "api-keys", "list")
            assert done.returncode == 2, done.stdout
            assert str(server.data_dir) in done.stderr and str(second.data_dir) in done.stderr
            assert "name one with --data-dir" in done.stderr
    done = _cli_without_data_dir(tmp_path, "api-keys", "create", "--name", "nowhere")
    assert done.returncode == 2 and "no pgplane serve running" in done.stderr, done.stderr
    assert not default.exists()
