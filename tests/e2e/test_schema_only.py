"""Schema-only branches (``init_source: schema-only``) against a real server and real Postgres.

A parent holding every kind of schema object a tenant makes, rows in its tables, a role made
with SQL, and settings; the schema-only branch has each object (owners, grants, comments
included), no rows, its sequences at their start, its materialized view unpopulated, and the
same passwords log in. At a point of history (``parent_timestamp`` before a migration) it holds
the schema as it was then. It is a root branch, as Neon shows one.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import sql

from tests import oldpg
from tests.support import Api, Server, pg_versions, running_server

PARENT_SCHEMA = """
CREATE ROLE app_reader LOGIN PASSWORD 'reader-secret-1';
GRANT app_reader TO CURRENT_USER;
CREATE EXTENSION hstore;
CREATE SCHEMA app;
GRANT USAGE, CREATE ON SCHEMA app TO app_reader;
CREATE TYPE app.mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN app.positive AS int CHECK (VALUE > 0);
CREATE SEQUENCE app.counter START 100;
CREATE TABLE app.people (
    id serial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    mood app.mood DEFAULT 'ok',
    n app.positive,
    attrs hstore,
    created timestamptz DEFAULT now()
);
CREATE TABLE app.pets (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    owner int REFERENCES app.people (id) ON DELETE CASCADE,
    name text CHECK (length(name) > 0)
);
CREATE INDEX pets_lower_name ON app.pets (lower(name));
CREATE VIEW app.names AS SELECT name FROM app.people;
CREATE MATERIALIZED VIEW app.census AS SELECT count(*) AS n FROM app.people;
CREATE FUNCTION app.plus_one(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT $1 + 1';
CREATE FUNCTION app.shout() RETURNS trigger LANGUAGE plpgsql AS
    $$BEGIN NEW.name := upper(NEW.name); RETURN NEW; END$$;
CREATE TRIGGER pets_shout BEFORE INSERT ON app.pets FOR EACH ROW EXECUTE FUNCTION app.shout();
COMMENT ON TABLE app.people IS 'everyone';
GRANT SELECT ON app.people TO app_reader;
CREATE TABLE app.readers_own (v int);
ALTER TABLE app.readers_own OWNER TO app_reader;
REVOKE CREATE ON SCHEMA app FROM app_reader;
INSERT INTO app.people (name, n) SELECT 'p' || g, g FROM generate_series(1, 50) g;
INSERT INTO app.pets (owner, name) SELECT g, 'pet' || g FROM generate_series(1, 50) g;
INSERT INTO app.readers_own SELECT generate_series(1, 10);
REFRESH MATERIALIZED VIEW app.census;
SELECT nextval('app.counter'), nextval('app.counter');
ALTER ROLE app_reader SET search_path = app, public;
ALTER ROLE app_reader IN DATABASE neondb SET work_mem = '8MB';
ALTER DATABASE neondb SET statement_timeout = '45s';
COMMENT ON DATABASE neondb IS 'the main one';
GRANT TEMPORARY ON DATABASE neondb TO app_reader WITH GRANT OPTION;
"""
TABLES = ("app.people", "app.pets", "app.readers_own")


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(PGPLANE_HISTORY_SECONDS="1") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key(f"schema-only-{time.monotonic_ns()}")
    with Api(server, key) as client:
        yield client


@pytest.fixture(scope="module")
def parent(api: Api) -> dict[str, Any]:
    created = api.create_ready_project(name="schema-only")
    pid, main = created["project"]["id"], created["branch"]["id"]
    r = api.http.post(
        f"/projects/{pid}/branches/{main}/databases",
        json={"database": {"name": "analytics", "owner_name": "neondb_owner"}},
    )
    api.settled(pid, r)
    uri = created["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(PARENT_SCHEMA)
    with psycopg.connect(uri.replace("/neondb?", "/analytics?"), autocommit=True) as conn:
        conn.execute("CREATE TABLE events AS SELECT generate_series(1, 30) AS id")
    return created


def with_login(uri: str, user: str, password: str) -> str:
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{quote(user)}:{quote(password)}@{host}"))


def neondb_uri(body: dict[str, Any]) -> str:
    return next(
        u["connection_uri"] for u in body["connection_uris"] if "/neondb?" in u["connection_uri"]
    )


def create_schema_only(api: Api, pid: str, **branch: Any) -> dict[str, Any]:
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={
            "branch": {"init_source": "schema-only", **branch},
            "endpoints": [{"type": "read_write"}],
        },
    )
    return api.settled(pid, r)


def test_a_schema_only_branch_has_every_object_and_no_rows(
    api: Api, parent: dict[str, Any]
) -> None:
    pid, main = parent["project"]["id"], parent["branch"]["id"]
    body = create_schema_only(api, pid, name="preview", parent_id=main)
    branch = body["branch"]
    assert branch["init_source"] == "schema-only"
    assert "parent_id" not in branch and "parent_lsn" not in branch  # a root, as Neon shows it
    assert [o["action"] for o in body["operations"]] == ["create_branch", "start_compute"]
    got = api.http.get(f"/projects/{pid}/branches/{branch['id']}").json()["branch"]
    assert got["init_source"] == "schema-only" and got["current_state"] == "ready"
    listed = api.http.get(f"/projects/{pid}/branches").json()["branches"]
    assert {b["id"]: b["init_source"] for b in listed}[main] == "parent-data"

    uri = neondb_uri(body)  # neondb_owner, its password as before
    assert (
        urlsplit(uri).password == urlsplit(parent["connection_uris"][0]["connection_uri"]).password
    )
    with psycopg.connect(uri, autocommit=True) as conn:
        for table in TABLES:
            query = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(*table.split(".")))
            row = conn.execute(query).fetchone()
            assert row == (0,), table
        objects = {
            "types": "SELECT typname FROM pg_type WHERE typnamespace = 'app'::regnamespace"
            " AND typname IN ('mood', 'positive')",
            "functions": "SELECT proname FROM pg_proc WHERE pronamespace = 'app'::regnamespace",
            "triggers": "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal",
            "indexes": "SELECT indexname FROM pg_indexes WHERE schemaname = 'app'",
            "extensions": "SELECT extname FROM pg_extension WHERE extname = 'hstore'",
        }
        found = {k: {r[0] for r in conn.execute(q).fetchall()} for k, q in objects.items()}
        assert found["types"] == {"mood", "positive"}
        assert found["functions"] == {"plus_one", "shout"}
        assert found["triggers"] == {"pets_shout"}
        assert {"pets_lower_name", "people_pkey", "people_name_key", "pets_pkey"} <= found[
            "indexes"
        ]
        assert found["extensions"] == {"hstore"}
        relations = dict(
            conn.execute(
                "SELECT relname, relkind::text FROM pg_class"
                " WHERE relnamespace = 'app'::regnamespace AND relkind IN ('v', 'm', 'S')"
            ).fetchall()
        )
        assert relations["names"] == "v" and relations["census"] == "m"
        assert relations["counter"] == "S" and relations["people_id_seq"] == "S"
        populated = conn.execute(
            "SELECT relispopulated FROM pg_class WHERE oid = 'app.census'::regclass"
        ).fetchone()
        assert populated == (False,)
        assert conn.execute("SELECT last_value, is_called FROM app.counter").fetchone() == (
            100,
            False,
        )
        assert conn.execute("SELECT nextval('app.counter')").fetchone() == (100,)
        assert conn.execute("SELECT obj_description('app.people'::regclass)").fetchone() == (
            "everyone",
        )
        owners = dict(
            conn.execute(
                "SELECT relname, relowner::regrole::text FROM pg_class"
                " WHERE relnamespace = 'app'::regnamespace AND relkind = 'r'"
            ).fetchall()
        )
        assert owners["readers_own"] == "app_reader" and owners["people"] != "app_reader"
        grants = conn.execute(
            "SELECT has_table_privilege('app_reader', 'app.people', 'SELECT'),"
            " has_table_privilege('app_reader', 'app.pets', 'SELECT'),"
            " has_schema_privilege('app_reader', 'app', 'CREATE')"
        ).fetchone()
        assert grants == (True, False, False)  # the build's own grants taken back
        roles = {r[0] for r in conn.execute("SELECT rolname FROM pg_roles").fetchall()}
        assert not any(r.startswith("pgplane_restore") for r in roles)
        assert "app_reader" in roles
        # Defaults, constraints and triggers work on the new rows.
        conn.execute("INSERT INTO app.people (name, n) VALUES ('x', 1)")
        conn.execute("INSERT INTO app.pets (owner, name) VALUES (1, 'rex')")
        assert conn.execute("SELECT name FROM app.pets").fetchone() == ("REX",)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("INSERT INTO app.people (name, n) VALUES ('y', -1)")

    assert_sql_role_logs_in(uri)
    assert_databases_carried(uri)

    # The parent keeps its rows.
    with psycopg.connect(parent["connection_uris"][0]["connection_uri"]) as conn:
        assert conn.execute("SELECT count(*) FROM app.people").fetchone() == (50,)


def assert_databases_carried(uri: str) -> None:
    """Every database, with its comment, settings and privileges; no rows in any."""
    with psycopg.connect(uri) as conn:
        row = conn.execute(
            "SELECT shobj_description(oid, 'pg_database'), datacl::text[] FROM pg_database"
            " WHERE datname = 'neondb'"
        ).fetchone()
        assert row is not None and row[0] == "the main one"
        assert "app_reader=T*/neondb_owner" in row[1] and "=Tc/neondb_owner" in row[1], row
        settings = {
            s
            for (config,) in conn.execute("SELECT setconfig FROM pg_db_role_setting").fetchall()
            for s in config
        }
        assert {"statement_timeout=45s", "work_mem=8MB", "search_path=app, public"} <= settings
    with psycopg.connect(uri.replace("/neondb?", "/analytics?")) as conn:
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)


def assert_sql_role_logs_in(uri: str) -> None:
    """A role made with SQL logs in with its password, its settings carried over."""
    reader = with_login(uri, "app_reader", "reader-secret-1")
    with psycopg.connect(reader) as conn:
        assert conn.execute("SHOW search_path").fetchone() == ("app, public",)
        conn.execute("SELECT * FROM people").fetchall()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(with_login(uri, "app_reader", "wrong")).close()


def test_a_schema_only_branch_at_a_point_before_a_migration(
    api: Api, parent: dict[str, Any]
) -> None:
    pid, main = parent["project"]["id"], parent["branch"]["id"]
    uri = parent["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        moment: datetime.datetime = row[0]
        time.sleep(0.05)  # a commit strictly after the point, not at it
        conn.execute("CREATE TABLE app.after_the_point (id int)")
    # A role made with the API after the point: the branch's roles (its parent's) name it.
    api.settled(
        pid,
        api.http.post(f"/projects/{pid}/branches/{main}/roles", json={"role": {"name": "late"}}),
    )
    when = moment.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    body = create_schema_only(
        api, pid, name="before-migration", parent_id=main, parent_timestamp=when
    )
    assert body["branch"]["init_source"] == "schema-only"
    with psycopg.connect(neondb_uri(body)) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables").fetchall()}
        assert {"people", "pets"} <= tables and "after_the_point" not in tables
        assert conn.execute("SELECT count(*) FROM app.people").fetchone() == (0,)
    bid = body["branch"]["id"]
    shown = api.http.get(f"/projects/{pid}/branches/{bid}/roles/late/reveal_password")
    assert shown.status_code == 200, shown.text
    late = with_login(neondb_uri(body), "late", shown.json()["password"])
    with psycopg.connect(late) as conn:  # made by the build, as the store says it is
        assert conn.execute("SELECT current_user").fetchone() == ("late",)


def test_schema_only_fields(api: Api, parent: dict[str, Any]) -> None:
    pid = parent["project"]["id"]
    for branch, field in (
        ({"init_source": "schema-only", "archived": True}, "archived"),
        ({"init_source": "nothing"}, "init_source"),
    ):
        r = api.http.post(f"/projects/{pid}/branches", json={"branch": branch})
        assert r.status_code == 400 and field in r.json()["message"], r.text


def test_a_suspended_parent_is_not_woken(api: Api, parent: dict[str, Any]) -> None:
    pid, main = parent["project"]["id"], parent["branch"]["id"]
    endpoint = parent["endpoints"][0]["id"]
    api.suspend(pid, endpoint)
    starts = sum(o["action"] == "start_compute" for o in api.operations(pid))
    body = create_schema_only(api, pid, name="from-a-sleeping-parent", parent_id=main)
    assert api.endpoint(pid, endpoint)["current_state"] == "idle"
    # The one start is the new branch's own compute's.
    assert sum(o["action"] == "start_compute" for o in api.operations(pid)) == starts + 1
    with psycopg.connect(neondb_uri(body)) as conn:
        assert conn.execute("SELECT count(*) FROM app.people").fetchone() == (0,)


@pytest.mark.skipif(
    15 not in pg_versions(), reason=f"no Postgres 15 here, nor Debian's to unpack: {oldpg.why_not}"
)
def test_an_older_major(api: Api) -> None:
    """Postgres 15: memberships without INHERIT/SET options, CREATEROLE as it was then."""
    created = api.create_ready_project(name="schema-only-15", pg_version=15)
    pid = created["project"]["id"]
    with psycopg.connect(created["connection_uris"][0]["connection_uri"], autocommit=True) as c:
        c.execute(
            "CREATE ROLE writer LOGIN PASSWORD 'writer-secret-2'; GRANT writer TO CURRENT_USER;"
            " CREATE SCHEMA s;"
            " GRANT CREATE, USAGE ON SCHEMA s TO writer; CREATE TABLE s.t (id int);"
            " ALTER TABLE s.t OWNER TO writer; REVOKE CREATE ON SCHEMA s FROM writer;"
            " INSERT INTO s.t VALUES (1)"
        )
    body = create_schema_only(api, pid, name="old")
    uri = body["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri) as conn:
        assert conn.execute("SELECT count(*) FROM s.t").fetchone() == (0,)
        owner = conn.execute("SELECT relowner::regrole::text FROM pg_class WHERE relname = 't'")
        assert owner.fetchone() == ("writer",)
        assert conn.execute("SELECT has_schema_privilege('writer', 's', 'CREATE')").fetchone() == (
            False,
        )
    with psycopg.connect(with_login(uri, "writer", "writer-secret-2")) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("writer",)
