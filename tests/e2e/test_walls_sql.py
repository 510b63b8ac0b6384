"""A tenant cannot steer the platform's sessions on its compute (issue 12, admin sessions).

As a tenant would, with only the project's connection URI (through the proxy) and its API key,
the test plants traps: ``search_path`` defaults for the database, the role and the endpoint's
``pg_settings`` that put tenant schemas before ``pg_catalog``, and views, functions and an
operator there that shadow every unqualified name the platform ever used. Each trap, if a
platform session runs it, records ``current_user`` and tries ``ALTER ROLE … SUPERUSER``. Then
every admin path runs: roles and databases created, changed and dropped, a password reset, a
branch copied online, suspend (asked for, and idle), start on connect, availability checks,
detach and reattach.
No trap may fire, the tenant stays a non-superuser, and every operation finishes.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo

from pgplane.compute.local.postgres.binaries import discover
from tests.support import Api, Server, running_server, wait_for

TRAP_PATH = "trap, public, pg_catalog"  # pg_catalog last: tenant objects come first

# The marker, and the payload every trap runs: whoever runs it is recorded, and a superuser
# would make the tenant one too.
FIRE = """
CREATE TABLE IF NOT EXISTS public.trap_fired (who text, what text);
GRANT ALL ON public.trap_fired TO PUBLIC;
CREATE OR REPLACE FUNCTION public.fire(what text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog AS $$
BEGIN
  INSERT INTO public.trap_fired VALUES (current_user, what);
  BEGIN
    EXECUTE 'ALTER ROLE neondb_owner SUPERUSER';
  EXCEPTION WHEN OTHERS THEN NULL;
  END;
  RETURN true;
END $$;
"""

# Every catalog relation and function the platform names, shadowed in ``schema``.
SHADOWS = """
CREATE SCHEMA IF NOT EXISTS {s};
GRANT USAGE ON SCHEMA {s} TO PUBLIC;
CREATE VIEW {s}.pg_roles AS SELECT * FROM pg_catalog.pg_roles WHERE public.fire('pg_roles');
CREATE VIEW {s}.pg_authid AS SELECT * FROM pg_catalog.pg_roles WHERE public.fire('pg_authid');
CREATE VIEW {s}.pg_auth_members AS
  SELECT * FROM pg_catalog.pg_auth_members WHERE public.fire('pg_auth_members');
CREATE VIEW {s}.pg_database AS
  SELECT * FROM pg_catalog.pg_database WHERE public.fire('pg_database');
CREATE VIEW {s}.pg_stat_activity AS
  SELECT * FROM pg_catalog.pg_stat_activity WHERE public.fire('pg_stat_activity');
CREATE VIEW {s}.pg_class AS SELECT * FROM pg_catalog.pg_class WHERE public.fire('pg_class');
CREATE FUNCTION {s}.pg_terminate_backend(integer) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('pg_terminate_backend') $$;
CREATE FUNCTION {s}.pg_terminate_backend(integer, bigint) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('pg_terminate_backend') $$;
CREATE FUNCTION {s}.pg_backend_pid() RETURNS integer LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_backend_pid') THEN pg_catalog.pg_backend_pid() END $$;
CREATE FUNCTION {s}.pg_get_userbyid(oid) RETURNS name LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_get_userbyid') THEN pg_catalog.pg_get_userbyid($1) END $$;
CREATE FUNCTION {s}.pg_switch_wal() RETURNS pg_lsn LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_switch_wal') THEN '0/0'::pg_lsn END $$;
CREATE FUNCTION {s}.pg_walfile_name(pg_lsn) RETURNS text LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_walfile_name') THEN 'x' END $$;
CREATE FUNCTION {s}.pg_current_xact_id() RETURNS xid8 LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_current_xact_id') THEN '0'::xid8 END $$;
CREATE FUNCTION {s}.pg_current_wal_lsn() RETURNS pg_lsn LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_current_wal_lsn') THEN '0/0'::pg_lsn END $$;
CREATE FUNCTION {s}.pg_current_wal_insert_lsn() RETURNS pg_lsn LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('pg_current_wal_insert_lsn') THEN '0/0'::pg_lsn END $$;
CREATE FUNCTION {s}.pg_is_in_recovery() RETURNS boolean LANGUAGE sql
  AS $$ SELECT NOT public.fire('pg_is_in_recovery') $$;
CREATE FUNCTION {s}.now() RETURNS timestamptz LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('now') THEN pg_catalog.now() END $$;
CREATE FUNCTION {s}.current_setting(text) RETURNS text LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('current_setting') THEN pg_catalog.current_setting($1) END $$;
CREATE FUNCTION {s}.set_config(text, text, boolean) RETURNS text LANGUAGE sql
  AS $$ SELECT CASE WHEN public.fire('set_config') THEN pg_catalog.set_config($1, $2, $3) END $$;
CREATE FUNCTION {s}.pg_has_role(text, text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('pg_has_role') $$;
CREATE FUNCTION {s}.name_eq_text(name, text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('=') AND $1::text OPERATOR(pg_catalog.=) $2 $$;
CREATE OPERATOR {s}.= (LEFTARG = name, RIGHTARG = text, FUNCTION = {s}.name_eq_text);
CREATE FUNCTION {s}.name_ne_text(name, text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('<>') AND $1::text OPERATOR(pg_catalog.<>) $2 $$;
CREATE OPERATOR {s}.<> (LEFTARG = name, RIGHTARG = text, FUNCTION = {s}.name_ne_text);
CREATE FUNCTION {s}.text_ne_text(text, text) RETURNS boolean LANGUAGE sql
  AS $$ SELECT public.fire('<>') AND $1 OPERATOR(pg_catalog.<>) $2 $$;
CREATE OPERATOR {s}.<> (LEFTARG = text, RIGHTARG = text, FUNCTION = {s}.text_ne_text);
"""


@pytest.fixture(scope="module")
def walls() -> Iterator[Server]:
    """A server of the test's own: availability checks every second, quick idle detach."""
    with running_server(
        PGPLANE_AVAILABILITY_CHECK_SECONDS="1",
        PGPLANE_DETACH_AFTER_SECONDS="3",
        PGPLANE_SCHEDULER_SECONDS="0.2",
        PGPLANE_DEFAULT_SUSPEND_TIMEOUT_SECONDS="600",
        PGPLANE_HISTORY_SECONDS="1",  # a restored branch's first base state at once
    ) as srv:
        yield srv


def _ops(api: Api, pid: str) -> list[dict[str, Any]]:
    r = api.http.get(f"/projects/{pid}/operations", params={"limit": 1000})
    assert r.status_code == 200, r.text
    return list(r.json()["operations"])


def _next_check(api: Api, pid: str, walls: Server, what: str) -> None:
    """Until an availability check of the project finishes after this moment."""
    checks = _finished(api, pid, "check_availability")
    wait_for(what, lambda: _finished(api, pid, "check_availability") > checks, 90, server=walls)


def _suspended_when_idle(api: Api, pid: str, endpoint: str, walls: Server) -> None:
    """A one-second suspend timeout, then until the idle suspend (the activity check first)."""
    api.settled(pid, api.http.patch(endpoint, json={"endpoint": {"suspend_timeout_seconds": 1}}))
    wait_for(
        "the idle suspend",
        lambda: api.http.get(endpoint).json()["endpoint"]["current_state"] == "idle",
        90,
        server=walls,
    )


def _finished(api: Api, pid: str, action: str) -> int:
    return sum(1 for o in _ops(api, pid) if o["action"] == action and o["status"] == "finished")


def _none_failed(api: Api, pid: str) -> None:
    """Every operation of the project, the platform's own included, settles and finishes."""
    ops = api.wait_operations(pid, [o["id"] for o in _ops(api, pid)])
    assert [o for o in ops if o["status"] != "finished"] == []


def _as(uri: str, **changes: str) -> str:
    return make_conninfo(uri, connect_timeout=60, **changes)


def _plant(uri: str, owner: str, database: str) -> None:
    """The traps in ``database``, as ``owner`` (the tenant), and its defaults pointing at them."""
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(FIRE.encode())
        for schema in ("trap", "public"):
            conn.execute(SHADOWS.format(s=schema).encode())
        conn.execute(f"ALTER DATABASE {database} SET search_path = {TRAP_PATH}".encode())
        conn.execute(f"ALTER ROLE {owner} SET search_path = {TRAP_PATH}".encode())


def _fired(uri: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(uri, autocommit=True) as conn:
        return conn.execute("SELECT who, what FROM public.trap_fired").fetchall()


def _is_superuser(uri: str) -> bool:
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute(
            "SELECT rolsuper FROM pg_catalog.pg_roles"
            " WHERE rolname OPERATOR(pg_catalog.=) 'neondb_owner'::pg_catalog.name"
        ).fetchone()
    assert row is not None
    return bool(row[0])


def _history_paths(api: Api, walls: Server, pid: str, bid: str, endpoint: str) -> None:
    """A branch at a point in time (the compute's latest WAL switched and archived first, its
    head asked for), a restore from its own past (the compute stopped, restarted on the
    restored data, its roles applied), and the restored branch's first base state (an online
    backup, as superuser). Settings that would point the archive or a replay elsewhere are
    refused."""
    now = datetime.datetime.now(datetime.UTC).isoformat()
    r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"parent_timestamp": now}})
    api.settled(pid, r)
    r = api.http.post(
        f"/projects/{pid}/branches/{bid}/restore",
        json={"source_branch_id": bid, "source_timestamp": now, "preserve_under_name": "old"},
    )
    api.settled(pid, r)
    bases = walls.data_dir / "projects" / pid / "branches" / bid / "base"
    wait_for("an online base state", lambda: list(bases.glob("*/base.json")), 90, server=walls)
    for name in ("archive_command", "archive_library", "restore_command", "archive_mode"):
        body = {"endpoint": {"settings": {"pg_settings": {name: "x"}}}}
        r = api.http.patch(endpoint, json=body)
        assert r.status_code == 400, (name, r.text)


def test_no_admin_path_runs_a_tenants_trap(walls: Server) -> None:
    _, key = walls.create_key("walls@example.com")
    with Api(walls, key) as api:
        project = api.create_ready_project(name="walls")
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        bid = project["branch"]["id"]
        uri = project["connection_uris"][0]["connection_uri"]
        branch = f"/projects/{pid}/branches/{bid}"
        endpoint = f"/projects/{pid}/endpoints/{eid}"

        # A second role and a database of its own, both with traps.
        body = api.settled(pid, api.http.post(f"{branch}/roles", json={"role": {"name": "mole"}}))
        mole_password = body["role"]["password"]
        api.settled(
            pid,
            api.http.post(
                f"{branch}/databases", json={"database": {"name": "den", "owner_name": "mole"}}
            ),
        )
        mole_uri = _as(uri, user="mole", password=mole_password, dbname="den")
        _plant(uri, "neondb_owner", "neondb")
        _plant(mole_uri, "mole", "den")
        # The endpoint's own settings point there too (the compute restarts with them).
        api.settled(
            pid,
            api.http.patch(
                endpoint,
                json={"endpoint": {"settings": {"pg_settings": {"search_path": TRAP_PATH}}}},
            ),
        )
        with psycopg.connect(_as(uri)) as conn:  # the tenant's own sessions do see the traps
            assert conn.execute("SHOW search_path").fetchone() == (TRAP_PATH,)

        # Availability checks visit every database of the running compute.
        _next_check(api, pid, walls, "an availability check")

        # A branch of the running compute: its online backup runs as superuser there.
        r = api.http.post(f"/projects/{pid}/branches", json={"branch": {"name": "copy"}})
        api.settled(pid, r)

        _history_paths(api, walls, pid, bid, endpoint)

        # Roles and databases changed and dropped, a password reset.
        api.settled(pid, api.http.post(f"{branch}/roles", json={"role": {"name": "vole"}}))
        r = api.http.post(f"{branch}/roles/mole/reset_password")
        mole_password = api.settled(pid, r)["role"]["password"]
        mole_uri = _as(uri, user="mole", password=mole_password, dbname="den")
        assert _fired(mole_uri) == []

        # Suspended when asked, started by a connection, checked while suspended.
        api.settled(pid, api.http.post(f"{endpoint}/suspend"))
        _next_check(api, pid, walls, "a check while suspended")
        with psycopg.connect(_as(uri)) as conn:
            conn.execute("SELECT 1")

        # Suspended when idle: the activity check runs first.
        _suspended_when_idle(api, pid, endpoint, walls)

        # Dropping a role reassigns and drops what it owns in each database, as superuser there.
        api.settled(pid, api.http.delete(f"{branch}/databases/den"))
        api.settled(pid, api.http.delete(f"{branch}/roles/mole"))
        api.settled(pid, api.http.delete(f"{branch}/roles/vole"))

        # Detached when idle, reattached and started by the next connection. Checks are off
        # meanwhile: the scheduler creates one in the very tick its detach scan runs, and an
        # operation under way keeps a project attached.
        walls.stop()
        walls.env["PGPLANE_AVAILABILITY_CHECK_SECONDS"] = "0"
        walls.start()
        try:
            wait_for(
                "the detach", lambda: _finished(api, pid, "tenant_detach") > 0, 90, server=walls
            )
        finally:
            walls.stop()
            walls.env["PGPLANE_AVAILABILITY_CHECK_SECONDS"] = "1"
            walls.start()
        assert _fired(_as(uri)) == []
        assert _finished(api, pid, "tenant_reattach") > 0
        assert not _is_superuser(_as(uri))
        _none_failed(api, pid)


VERSIONS = list(discover([]))


@pytest.mark.parametrize("version", VERSIONS)
def test_what_createrole_may_grant_depends_on_the_version(walls: Server, version: int) -> None:
    """CREATEROLE (which neondb_owner has, as on Neon) may grant any non-superuser role and alter
    any non-superuser role up to Postgres 15; from 16 on only those it holds ADMIN on. The
    platform's monitor survives either way: checks repair it and still answer."""
    _, key = walls.create_key(f"createrole{version}@example.com")
    with Api(walls, key) as api:
        project = api.create_ready_project(name=f"createrole-{version}", pg_version=version)
        pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
        uri = _as(project["connection_uris"][0]["connection_uri"])
        attempts = [
            "GRANT pg_execute_server_program TO neondb_owner",
            "ALTER ROLE pgplane_monitor NOLOGIN",
            "REVOKE pg_monitor FROM pgplane_monitor",
        ]
        with psycopg.connect(uri, autocommit=True) as conn:
            for statement in attempts:
                if version <= 15:
                    conn.execute(statement.encode())
                else:
                    with pytest.raises(errors.InsufficientPrivilege):
                        conn.execute(statement.encode())
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute("ALTER ROLE cloud_admin NOLOGIN")
            if version <= 15:  # what the grant opens: the compute's OS user (osusers' walls)
                conn.execute("CREATE TEMP TABLE t_out (line text)")
                conn.execute("COPY t_out FROM PROGRAM 'id -un'")
        assert not _is_superuser(uri)

        # The platform still checks the compute and suspends it when idle.
        _next_check(api, pid, walls, "a check")
        endpoint = f"/projects/{pid}/endpoints/{eid}"
        _suspended_when_idle(api, pid, endpoint, walls)
        _none_failed(api, pid)


@pytest.mark.parametrize("name", ["pgplane_monitor", "PGPLANE_MONITOR", "cloud_admin", "pg_x"])
def test_the_platforms_role_names_are_refused(walls: Server, name: str) -> None:
    _, key = walls.create_key(f"names-{name.lower()}@example.com")
    with Api(walls, key) as api:
        project = api.create_project(name="names")
        pid, bid = project["project"]["id"], project["branch"]["id"]
        r = api.http.post(f"/projects/{pid}/branches/{bid}/roles", json={"role": {"name": name}})
        assert r.status_code == 400, r.text
        assert "reserved" in r.json()["message"] or "pattern" in r.json()["message"], r.text
