"""Tenant walls of schema-only branches: a hostile parent schema gets nothing from the restore.

A schema is the tenant's SQL, and restoring one runs some of it: Postgres folds an immutable
function called with constants as it creates a partition key, a generated column or an index
expression. The parent's ``folded()`` calls ``probe()``, which tries what a superuser could (make
the tenant's roles superusers, create one, join the server-file roles, run a program, read a
file) and writes down who it ran as. The restore runs it as the tenant's own roles: every try
fails, no role of the branch is a superuser but the platform's, and the witness rows it wrote
say so. An event trigger in the parent (only a superuser makes one: here the test, as the
platform would) is refused by the restore, with Postgres' reason on the failed operation; the
platform's roles are not copied, and another project's objects never appear.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.local.copies.timeline import temporary_pgdata
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from tests.support import Api, Server, running_server, wait_for

PWNED = Path("/tmp/pgplane-schema-only-pwned")
HOSTILE = """
CREATE TABLE public.aaa_witness (who text, superuser bool);
CREATE FUNCTION public.probe() RETURNS int LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  r text;
BEGIN
  FOR r IN SELECT rolname FROM pg_catalog.pg_roles WHERE rolname !~ '^pg_' LOOP
    BEGIN EXECUTE format('ALTER ROLE %I SUPERUSER', r); EXCEPTION WHEN OTHERS THEN NULL; END;
    BEGIN EXECUTE format('GRANT pg_execute_server_program, pg_read_server_files TO %I', r);
    EXCEPTION WHEN OTHERS THEN NULL; END;
  END LOOP;
  BEGIN CREATE ROLE escalated SUPERUSER LOGIN PASSWORD 'x'; EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN COPY (SELECT 1) TO PROGRAM 'touch /tmp/pgplane-schema-only-pwned';
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN PERFORM pg_read_file('/etc/hostname'); INSERT INTO public.aaa_witness VALUES ('read', true);
  EXCEPTION WHEN OTHERS THEN NULL; END;
  BEGIN
    INSERT INTO public.aaa_witness
      SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
  EXCEPTION WHEN OTHERS THEN NULL; END;
  RETURN 0;
END $$;
CREATE FUNCTION public.folded(int) RETURNS int LANGUAGE sql IMMUTABLE
  AS 'SELECT $1 + public.probe()';
CREATE TABLE public.zz_parts (a int) PARTITION BY RANGE ((a + public.folded(1)));
CREATE TABLE public.zz_generated (a int, b int GENERATED ALWAYS AS (a + public.folded(2)) STORED);
CREATE INDEX zz_expression ON public.zz_generated ((a + public.folded(3)));
"""


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key(f"walls-schema-only-{time.monotonic_ns()}")
    with Api(server, key) as client:
        yield client


def _branch(api: Api, pid: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"init_source": "schema-only"}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    return body, api.wait_operations(pid, [o["id"] for o in body["operations"]], timeout=120)


def test_a_hostile_schema_runs_as_the_tenant(server: Server, api: Api) -> None:
    PWNED.unlink(missing_ok=True)
    with Api(server, server.create_key(f"elsewhere-{time.monotonic_ns()}")[1]) as other:
        elsewhere = other.create_ready_project(name="elsewhere")
        with psycopg.connect(elsewhere["connection_uris"][0]["connection_uri"]) as conn:
            conn.execute("CREATE TABLE other_projects_secret (v int)")
    created = api.create_ready_project(name="hostile")
    pid = created["project"]["id"]
    with psycopg.connect(created["connection_uris"][0]["connection_uri"], autocommit=True) as conn:
        conn.execute(HOSTILE)
        conn.execute("GRANT SELECT ON aaa_witness TO pgplane_monitor")
        conn.execute("DELETE FROM aaa_witness")  # what its own creation wrote
    body, ops = _branch(api, pid)
    assert [o["status"] for o in ops] == ["finished", "finished"], ops

    with psycopg.connect(body["connection_uris"][0]["connection_uri"]) as conn:
        supers = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles WHERE rolsuper")}
        assert supers == {"cloud_admin"}
        members = conn.execute(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.roleid"
            " WHERE r.rolname IN ('pg_execute_server_program', 'pg_read_server_files')"
        ).fetchone()
        assert members == (0,)
        witnesses = conn.execute("SELECT who, superuser FROM aaa_witness").fetchall()
        # It ran during the restore (the folds), as a role of the tenant's, never a superuser.
        assert witnesses and all(superuser is False for _, superuser in witnesses), witnesses
        assert all(who != "read" for who, _ in witnesses)
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables")}
        assert "other_projects_secret" not in tables and "zz_generated" in tables
        granted = conn.execute(
            "SELECT count(*) FROM information_schema.role_table_grants"
            " WHERE grantee IN ('cloud_admin', 'pgplane_monitor')"
            " AND table_name = 'aaa_witness'"
        ).fetchone()
        assert granted == (0,)  # grants to the platform's roles are not carried over
        roles = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles")}
        assert "escalated" not in roles
        assert not any(r.startswith("pgplane_restore") for r in roles)
    assert not PWNED.exists()


def test_an_event_trigger_is_refused_with_its_reason(server: Server, api: Api) -> None:
    created = api.create_ready_project(name="event-trigger")
    pid, bid = created["project"]["id"], created["branch"]["id"]
    data_dir = server.data_dir.resolve()
    running = Records(data_dir / "postmasters").get(Layout(data_dir).pgdata(pid, bid))
    assert running is not None
    # Only a superuser makes one: the test, on the compute's own socket, as the platform could.
    as_superuser = f"host={running.socket_dir} port={running.port} user=cloud_admin dbname=neondb"
    with psycopg.connect(as_superuser, autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION public.on_ddl() RETURNS event_trigger LANGUAGE plpgsql AS"
            " $$BEGIN EXECUTE 'ALTER ROLE neondb_owner SUPERUSER'; END$$"
        )
        conn.execute(
            "CREATE EVENT TRIGGER on_ddl ON ddl_command_end EXECUTE FUNCTION public.on_ddl()"
        )
    _, ops = _branch(api, pid)
    create = ops[0]
    assert create["action"] == "create_branch" and create["status"] == "failed", ops
    assert "event trigger" in create["error"] and "permission denied" in create["error"], create
    assert create["failures_count"] == 1  # a schema that cannot be restored is not retried


def test_a_schema_s_functions_run_inside_a_cgroup(server: Server, api: Api) -> None:
    """The restore runs the schema's functions (a fold of an immutable one, here one that
    sleeps): its postmaster is in a cgroup of the smallest compute's size, as the tenant's
    code always is, never with the platform's whole machine (it reached 3.3 GB there)."""
    if os.geteuid() != 0:
        pytest.skip("cgroups need root")
    created = api.create_ready_project(name="schema-in-a-cgroup")
    pid = created["project"]["id"]
    with psycopg.connect(created["connection_uris"][0]["connection_uri"], autocommit=True) as conn:
        conn.execute(
            "CREATE FUNCTION public.slow(int) RETURNS int LANGUAGE sql IMMUTABLE"
            " AS 'SELECT $1 + (SELECT 0 FROM pg_sleep(6))'"
        )
        conn.execute("CREATE TABLE t (a int)")
        conn.execute("CREATE INDEX t_slow ON t ((a + public.slow(1)))")
    r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"init_source": "schema-only"}})
    assert r.status_code == 201, r.text
    body = r.json()
    data_dir = server.data_dir.resolve()
    building = temporary_pgdata(Layout(data_dir).pgdata(pid, body["branch"]["id"]))

    def placed() -> tuple[str, int] | None:
        running = Records(data_dir / "postmasters").get(building)  # read anew: it caches
        return None if running is None or not running.leader else (running.cgroup, running.leader)

    found = wait_for("the build's postmaster", placed, 60)
    cgroup, leader = found
    assert cgroup, "the build's postmaster runs in no cgroup"
    # Placed as it starts (before its first client): by the time the restore runs, in it.
    wait_for("it in its cgroup", lambda: cgroup in Path(f"/proc/{leader}/cgroup").read_text(), 10)
    ops = api.wait_operations(pid, [o["id"] for o in body["operations"]], timeout=120)
    assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
