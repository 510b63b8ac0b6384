"""The command line on a data directory (headless installs): keys for the account that signs in
to the console, listed and revoked; accounts listed."""

from __future__ import annotations

import json
import os
import subprocess

import httpx

from tests.console import PASSWORD, Browser
from tests.support import PGPLANE, run_cli, running_server


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
