"""Tenant walls of the schema read (``GET …/schema``): what a tenant writes cannot steer it.

As a tenant would, with its connection URI and API key: a database whose name reads as a libpq
connection string, a table whose name and comment hold SQL and psql meta-commands, and grants to
the platform's roles. The dump stays the tenant's own database's (not another project's, not the
one a name would point libpq at), quotes every name and comment as data, keeps the platform's
roles out, and replays with psql as it reads.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from psycopg import sql

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.binaries import wheel_bin_dir
from pgplane.compute.local.postgres.records import Records
from tests.support import Api, Server, running_server, wait_for

CONNINFO_NAME = "dbname=postgres user=cloud_admin port=1"
_STALLED = 6  # the threads of Python's default pool on two cores
HOSTILE_TABLE = 'x"; GRANT ALL ON SCHEMA public TO cloud_admin; --'
HOSTILE_COMMENT = (
    "it';\nGRANT SELECT ON TABLE public.t TO cloud_admin;\n\\! touch /tmp/pgplane-pwned\n"
    "$$ /* -- \\unrestrict x\n"
)


@pytest.fixture(scope="module")
def walls_server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


def _api(server: Server, name: str) -> Api:
    _, key = server.create_key(f"{name}-{time.monotonic_ns()}")
    return Api(server, key)


@pytest.fixture(scope="module")
def tenant(walls_server: Server) -> Iterator[dict[str, Any]]:
    with _api(walls_server, "other") as other:
        elsewhere = other.create_ready_project(name="elsewhere")
        with psycopg.connect(elsewhere["connection_uris"][0]["connection_uri"]) as conn:
            conn.execute("CREATE TABLE other_projects_secret (v int)")
    with _api(walls_server, "tenant") as api:
        created = api.create_ready_project(name="walls")
        pid, branch = created["project"]["id"], created["branch"]["id"]
        owner = created["roles"][0]["name"] if created.get("roles") else None
        owner = owner or created["databases"][0]["owner_name"]
        r = api.http.post(
            f"/projects/{pid}/branches/{branch}/databases",
            json={"database": {"name": CONNINFO_NAME, "owner_name": owner}},
        )
        api.settled(pid, r)
        uri = created["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute(f'CREATE TABLE "{HOSTILE_TABLE.replace(chr(34), chr(34) * 2)}" (v int)')
            comment = sql.SQL("COMMENT ON TABLE t IS {}").format(sql.Literal(HOSTILE_COMMENT))
            conn.execute(comment)
            conn.execute("GRANT SELECT ON TABLE t TO cloud_admin, pgplane_monitor")
            conn.execute("ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO pgplane_monitor")
        hostile_uri = uri.replace(
            f"/{created['databases'][0]['name']}?", f"/{CONNINFO_NAME.replace(' ', '%20')}?"
        )
        with psycopg.connect(hostile_uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE inside_the_oddly_named_database (v int)")
        yield {
            "api": api,
            "server": walls_server,
            "pid": pid,
            "branch": branch,
            "uri": uri,
            "created": created,
        }


def _schema(t: dict[str, Any], db_name: str) -> str:
    r = t["api"].http.get(
        f"/projects/{t['pid']}/branches/{t['branch']}/schema", params={"db_name": db_name}
    )
    assert r.status_code == 200, r.text
    return str(r.json()["sql"])


def test_a_conninfo_name_stays_a_name(tenant: dict[str, Any]) -> None:
    dump = _schema(tenant, CONNINFO_NAME)
    assert "CREATE TABLE public.inside_the_oddly_named_database" in dump
    assert "other_projects_secret" not in dump


def test_hostile_names_and_comments_stay_data(tenant: dict[str, Any]) -> None:
    dump = _schema(tenant, tenant["created"]["databases"][0]["name"])
    assert "other_projects_secret" not in dump
    assert "inside_the_oddly_named_database" not in dump
    escaped = HOSTILE_TABLE.replace('"', '""')
    assert f'CREATE TABLE public."{escaped}" (' in dump
    comment = "COMMENT ON TABLE public.t IS '" + HOSTILE_COMMENT.replace("'", "''") + "';"
    assert comment in dump  # whole, though a line of it reads as a grant to cloud_admin
    # The tenant's grants to the platform's roles are left out, nothing else of the tenant's.
    assert "GRANT SELECT ON TABLE public.t TO neondb_owner;" not in dump  # the owner's own
    for line in dump.replace(comment, "").splitlines():
        if line.startswith(("GRANT", "REVOKE", "ALTER DEFAULT PRIVILEGES")):
            assert "cloud_admin" not in line and "pgplane_monitor" not in line, line
    # Replayed with psql into a new database, the dump makes the same schema and nothing else
    # (its \restrict key holds: the comment's meta-command never runs).
    with psycopg.connect(tenant["uri"], autocommit=True) as conn:
        conn.execute("CREATE DATABASE replayed")
    replay_uri = tenant["uri"].replace(
        f"/{tenant['created']['databases'][0]['name']}?", "/replayed?"
    )
    done = subprocess.run(
        [_psql(), "-X", "-v", "ON_ERROR_STOP=1", "-q", "-d", _on_its_socket(tenant, "replayed")],
        input=dump,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    with psycopg.connect(replay_uri) as conn:
        (comment,) = conn.execute(
            "SELECT obj_description('public.t'::regclass, 'pg_class')"
        ).fetchone() or (None,)
    assert comment == HOSTILE_COMMENT


def _psql() -> str:
    """The bundled psql (18: it knows ``\\restrict``; it has no TLS, so the replay goes to the
    compute's own socket rather than through the proxy)."""
    bin_dir = wheel_bin_dir()
    assert bin_dir is not None
    return str(bin_dir / "psql")


def _on_its_socket(t: dict[str, Any], dbname: str) -> str:
    """The tenant's own role on its compute's private socket, as the platform records it."""
    data_dir = t["server"].data_dir.resolve()
    pgdata = Layout(data_dir).pgdata(t["pid"], t["branch"])
    running = Records(data_dir / "postmasters").get(pgdata)
    assert running is not None
    role = t["created"]["databases"][0]["owner_name"]
    return f"host={running.socket_dir} port={running.port} user={role} dbname={dbname}"


def test_one_accounts_stalled_schema_reads_stall_no_other_accounts_writes(
    walls_server: Server,
) -> None:
    """A schema read waits on ``pg_dump``, which waits on the tenant's server: a table the
    tenant keeps locked holds it up to its lock timeout. Six such reads of one account, on six
    branches, held every thread of the platform's default pool (six on two cores), where the
    store's commits waited too: every other account's writes waited with them. Tenants' reads
    wait in a pool of their own now, two of a project's at once, and the store commits on a
    thread of its own."""
    with _api(walls_server, "stalling") as a, _api(walls_server, "writing") as b:
        stalling = a.create_ready_project(name="stalling")
        pid = stalling["project"]["id"]
        db_name = stalling["databases"][0]["name"]
        with psycopg.connect(stalling["connection_uris"][0]["connection_uri"]) as conn:
            conn.execute("CREATE TABLE t (v int)")
        branches = []
        for n in range(_STALLED):
            r = a.http.post(
                f"/projects/{pid}/branches",
                json={"branch": {"name": f"s{n}"}, "endpoints": [{"type": "read_write"}]},
            )
            branches.append(a.settled(pid, r))
        writing = b.create_ready_project(name="writing")
        with contextlib.ExitStack() as locks:
            lockers = [
                locks.enter_context(psycopg.connect(branch["connection_uris"][0]["connection_uri"]))
                for branch in branches
            ]
            for locker in lockers:
                locker.execute("LOCK TABLE t IN ACCESS EXCLUSIVE MODE")  # held: the dump waits
            answered: list[int] = []

            def read(branch_id: str) -> None:
                with httpx.Client(
                    base_url=a.http.base_url, headers=a.http.headers, timeout=120
                ) as http:
                    r = http.get(
                        f"/projects/{pid}/branches/{branch_id}/schema",
                        params={"db_name": db_name},
                    )
                    answered.append(r.status_code)

            reads = [
                threading.Thread(target=read, args=(branch["branch"]["id"],)) for branch in branches
            ]
            for thread in reads:
                thread.start()

            def dump_waiting(locker: psycopg.Connection[Any]) -> bool:
                row = locker.execute(
                    "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 't'::regclass"
                ).fetchone()
                return row is not None and row[0] >= 1

            # The first (two, of one project) under way; the others wait their turn.
            wait_for("a dump waiting on the tenant's lock", lambda: any(map(dump_waiting, lockers)))
            for n in range(3):  # another account's writes, each a commit of the store
                r = b.http.patch(
                    f"/projects/{writing['project']['id']}",
                    json={"project": {"name": f"still-writing-{n}"}},
                )
                assert r.status_code == 200, r.text
            assert answered == [], answered  # while every read still waits on a lock
        for thread in reads:  # the locks let go (their sessions closed): the reads go on
            thread.join(120)
        assert sorted(answered) == [200] * _STALLED, answered
        r = a.http.delete(f"/projects/{pid}")
        assert r.status_code == 200, r.text
