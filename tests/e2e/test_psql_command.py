"""``pgplane psql``: a session to a branch with the psql that comes with pgplane (built without
SSL) through its TLS relay, on a machine with no Postgres of its own (CI hides the system's):
a query, a script on stdin, a wrong password's refusal as libpq prints it, a certificate
checked against the platform's CA, and Ctrl-C cancelling the query as psql's own does."""

from __future__ import annotations

import os
import signal
import subprocess
from typing import Any

import psycopg

from tests.support import PGPLANE, Api, Server, wait_for


def _psql(uri: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PGPLANE, "psql", uri, "--", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _project(api: Api, name: str) -> tuple[dict[str, Any], str]:
    body = api.create_ready_project(name=name)
    return body, str(body["connection_uris"][0]["connection_uri"])


def test_queries_scripts_and_refusals_through_the_relay(server: Server, api: Api) -> None:
    _, uri = _project(api, "psql-first")
    done = _psql(uri, "-Atc", "select 41 + 1")
    assert (done.returncode, done.stdout) == (0, "42\n"), done.stderr

    script = (
        "create table t (v int);\n"
        "insert into t select generate_series(1, 5);\n"
        "select sum(v) from t;\n"
    )
    done = _psql(uri, "-At", "-v", "ON_ERROR_STOP=1", stdin=script)
    assert (done.returncode, done.stdout.splitlines()[-1]) == (0, "15"), done.stderr

    done = _psql(uri.replace("npg_", "npx_"), "-Atc", "select 1")
    assert done.returncode == 2
    assert 'password authentication failed for user "neondb_owner"' in done.stderr, done.stderr

    # Checked as libpq checks: against the platform's CA, and its name (localhost).
    ca = server.data_dir / "tls" / "ca.crt"
    verified = uri.replace("sslmode=require", f"sslmode=verify-full&sslrootcert={ca}")
    done = _psql(verified, "-Atc", "select current_user")
    assert (done.returncode, done.stdout) == (0, "neondb_owner\n"), done.stderr
    unknown = uri.replace("sslmode=require", "sslmode=verify-full&sslrootcert=system")
    done = _psql(unknown, "-Atc", "select 1")
    assert done.returncode == 2 and "certificate verify failed" in done.stderr, done.stderr


def test_ctrl_c_cancels_the_query_through_the_relay(api: Api) -> None:
    _, uri = _project(api, "psql-cancel")
    psql = subprocess.Popen(
        [*PGPLANE, "psql", uri, "--", "-c", "select pg_sleep(120)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        with psycopg.connect(uri, autocommit=True) as conn:
            sleeping = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'select pg_sleep%'"

            def running() -> bool:
                row = conn.execute(sleeping).fetchone()
                return row is not None and row[0] == 1

            wait_for("the query running", running, 60)
            os.killpg(psql.pid, signal.SIGINT)  # what Ctrl-C sends the terminal's job
            _, err = psql.communicate(timeout=30)
        assert psql.returncode == 1, err
        assert "canceling statement due to user request" in err, err
    finally:
        if psql.poll() is None:
            psql.kill()
            psql.wait()
