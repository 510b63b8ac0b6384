"""Postgres 15 and older, which hand any role with CREATEROLE the OS user of its compute: a project
made on one is told so (API and console), an operator may refuse them to new projects, and the
projects already on one keep working (branches, wakes).
"""

from __future__ import annotations

import psycopg
import pytest

from tests import oldpg
from tests.console import PASSWORD, Browser
from tests.support import Api, Server, pg_versions, run_cli, running_server

OLD = [v for v in pg_versions() if v <= 15]
pytestmark = pytest.mark.skipif(
    not OLD, reason=f"no Postgres 15 or older here, nor Debian's to unpack: {oldpg.why_not}"
)
EMAIL = "old-majors@example.com"
HINT = "(CREATEROLE reaches the OS)"


def _offered(browser: Browser) -> str:
    """The console's projects page, with its new-project form."""
    page = browser.get("/console/projects/")
    assert page.status_code == 200, page.text
    return page.text


def _restart(server: Server, **env: str) -> None:
    server.stop()
    server.env.update(env)
    server.start()


def test_an_old_major_is_warned_of_and_an_operator_can_refuse_it() -> None:
    old, newest = max(OLD), max(pg_versions())
    with running_server() as srv:
        done = run_cli(
            "accounts", "create", EMAIL, "--password-stdin", data_dir=srv.data_dir, stdin=PASSWORD
        )
        assert done.returncode == 0, done.stderr
        with Api(srv, srv.create_key(EMAIL)[1]) as api, Browser(srv) as browser:
            assert browser.sign_in(EMAIL).status_code == 303

            made = api.create_ready_project(name="old", pg_version=old)
            assert made["project"]["pg_version"] == old
            (warning,) = made["warnings"]
            assert warning["code"] == "PG_VERSION_CREATEROLE_OS_ACCESS"
            assert "CREATEROLE" in warning["message"]
            assert "pg_execute_server_program" in warning["message"]
            fresh = api.create_project(name="new", pg_version=newest)
            assert "warnings" not in fresh  # Neon's shape exactly, where there is nothing to say
            form = _offered(browser)
            assert f'<option value="{old}">{old} {HINT}</option>' in form
            assert f'<option value="{newest}">{newest}</option>' in form
            assert 'id="old-major-hint"' in form and "pg_execute_server_program" in form

            # The operator offers only 16 and newer: an old major is a 400 that changes nothing.
            _restart(srv, PGPLANE_MIN_PG_VERSION=str(old + 1))
            projects = api.http.get("/projects").json()["projects"]
            r = api.http.post("/projects", json={"project": {"name": "no", "pg_version": old}})
            assert r.status_code == 400, r.text
            body = r.json()
            assert body["code"] == "BAD_REQUEST"
            assert f"pg_version {old}" in body["message"]
            assert "pg_execute_server_program" in body["message"]
            assert api.http.get("/projects").json()["projects"] == projects
            assert str(newest) in body["message"]  # what may be asked for instead
            form = _offered(browser)
            assert f'<option value="{old}">' not in form and 'id="old-major-hint"' not in form
            api.create_project(name="newest-still")

            # The project already on the old major keeps working: a branch with a compute, and
            # its own compute woken by a connection.
            pid, eid = made["project"]["id"], made["endpoints"][0]["id"]
            api.settled(
                pid,
                api.http.post(
                    f"/projects/{pid}/branches", json={"endpoints": [{"type": "read_write"}]}
                ),
            )
            api.suspend(pid, eid)
            uri = made["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=60) as conn:
                row = conn.execute("select current_setting('server_version_num')::int").fetchone()
            assert row is not None and row[0] // 10000 == old
