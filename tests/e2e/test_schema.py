"""A branch's schema and the schema diff (``GET …/schema``, ``…/compare_schema``) against a real
server: after a migration, through the API and through ``neonctl branches schema-diff`` and
``neonctl diff``; a suspended compute left asleep; platform roles kept out; bad parameters."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.neonctl import Neonctl, install
from tests.support import Api, Server, running_server

MIGRATION = """
CREATE TABLE orders (id bigint PRIMARY KEY, customer text NOT NULL, total numeric);
CREATE INDEX orders_customer ON orders (customer);
CREATE VIEW big_orders AS SELECT id, total FROM orders WHERE total > 100;
CREATE FUNCTION order_count() RETURNS bigint LANGUAGE sql AS 'SELECT count(*) FROM orders';
"""
MAX_BYTES = 300_000  # the server's bound: a few big comments pass it


@pytest.fixture(scope="module")
def schema_server() -> Iterator[Server]:
    with running_server(PGPLANE_SCHEMA_MAX_BYTES=str(MAX_BYTES)) as srv:
        yield srv


@pytest.fixture(scope="module")
def sapi(schema_server: Server) -> Iterator[Api]:
    _, key = schema_server.create_key(f"schema-{time.monotonic_ns()}")
    with Api(schema_server, key) as client:
        yield client


def _branch(api: Api, pid: str, name: str) -> tuple[str, str, str]:
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": name}, "endpoints": [{"type": "read_write"}]},
    )
    body = api.settled(pid, r)
    return (
        body["branch"]["id"],
        body["endpoints"][0]["id"],
        body["connection_uris"][0]["connection_uri"],
    )


def _sql(uri: str, statements: str) -> None:
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute(statements)


@pytest.fixture(scope="module")
def project(sapi: Api) -> dict[str, Any]:
    """A project whose ``migrated`` child ran MIGRATION and whose ``same`` child ran nothing."""
    created = sapi.create_ready_project(name="schema")
    pid = created["project"]["id"]
    main_uri = created["connection_uris"][0]["connection_uri"]
    _sql(main_uri, "CREATE TABLE customers (id int PRIMARY KEY, name text)")
    migrated, migrated_ep, migrated_uri = _branch(sapi, pid, "migrated")
    _sql(migrated_uri, MIGRATION)
    same, _, _ = _branch(sapi, pid, "same")
    return {
        "pid": pid,
        "main": created["branch"]["id"],
        "main_uri": main_uri,
        "db": created["databases"][0]["name"],
        "migrated": migrated,
        "migrated_ep": migrated_ep,
        "migrated_uri": migrated_uri,
        "same": same,
    }


def _schema(api: Api, p: dict[str, Any], branch: str, **params: str) -> str:
    r = api.http.get(
        f"/projects/{p['pid']}/branches/{branch}/schema", params={"db_name": p["db"], **params}
    )
    assert r.status_code == 200, r.text
    assert set(r.json()) == {"sql"}
    return str(r.json()["sql"])


def _compare(api: Api, p: dict[str, Any], branch: str, **params: str) -> str:
    r = api.http.get(
        f"/projects/{p['pid']}/branches/{branch}/compare_schema",
        params={"db_name": p["db"], **params},
    )
    assert r.status_code == 200, r.text
    return str(r.json()["diff"])


def test_schema_after_a_migration(sapi: Api, project: dict[str, Any]) -> None:
    sql = _schema(sapi, project, project["migrated"])
    for made in (
        "CREATE TABLE public.orders (",
        "CREATE TABLE public.customers (",
        "CREATE INDEX orders_customer ON public.orders USING btree (customer);",
        "CREATE VIEW public.big_orders AS",
        "CREATE FUNCTION public.order_count() RETURNS bigint",
        "ADD CONSTRAINT orders_pkey PRIMARY KEY (id);",
    ):
        assert made in sql, (made, sql)
    assert "-- PostgreSQL database dump" in sql
    for platform_role in ("cloud_admin", "pgplane_monitor"):
        assert platform_role not in sql
    # The same schema reads the same (pg_dump's \restrict key is derived, not random).
    assert _schema(sapi, project, project["migrated"]) == sql
    assert "orders" not in _schema(sapi, project, project["main"])


def test_compare_schema_shows_the_migration(sapi: Api, project: dict[str, Any]) -> None:
    diff = _compare(sapi, project, project["migrated"])  # against its parent by default
    assert diff.startswith("--- "), diff
    assert "+CREATE TABLE public.orders (" in diff
    assert "+CREATE VIEW public.big_orders AS" in diff
    assert not any(line.startswith("-CREATE") for line in diff.splitlines()), diff
    named = _compare(sapi, project, project["main"], base_branch_id=project["migrated"])
    assert "-CREATE TABLE public.orders (" in named
    assert _compare(sapi, project, project["same"]) == ""
    assert _compare(sapi, project, project["same"], base_branch_id=project["main"]) == ""


def test_a_suspended_compute_is_not_woken(sapi: Api, project: dict[str, Any]) -> None:
    pid, ep = project["pid"], project["migrated_ep"]
    sapi.suspend(pid, ep)
    before = len(sapi.operations(pid))
    sql = _schema(sapi, project, project["migrated"])
    assert "CREATE TABLE public.orders (" in sql
    assert "+CREATE TABLE public.orders (" in _compare(sapi, project, project["migrated"])
    assert sapi.endpoint(pid, ep)["current_state"] == "idle"
    assert len(sapi.operations(pid)) == before  # no start_compute
    # The compute still starts on its data afterwards (the temporary postmaster is gone).
    _sql(project["migrated_uri"], "SELECT 1")


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({}, "db_name"),
        ({"lsn": "FF/0"}, "lsn"),
        ({"timestamp": "2024-01-01T00:00:00Z"}, "timestamp"),
        ({"format": "json"}, "format"),
    ],
)
def test_bad_schema_parameters_are_400s(
    sapi: Api, project: dict[str, Any], params: dict[str, str], field: str
) -> None:
    full = params if not params else {"db_name": project["db"], **params}
    r = sapi.http.get(
        f"/projects/{project['pid']}/branches/{project['migrated']}/schema", params=full
    )
    assert r.status_code == 400, r.text
    assert field in r.json()["message"]


@pytest.mark.parametrize("field", ["lsn", "timestamp", "base_lsn", "base_timestamp"])
def test_compare_schema_points_are_checked(sapi: Api, project: dict[str, Any], field: str) -> None:
    # Outside the history (tests/e2e/test_schema_history.py reads points within it).
    value = "FF/0" if field.endswith("lsn") else "2024-01-01T00:00:00Z"
    r = sapi.http.get(
        f"/projects/{project['pid']}/branches/{project['migrated']}/compare_schema",
        params={"db_name": project["db"], field: value},
    )
    assert r.status_code == 400, r.text
    assert r.json()["message"].startswith(f"{field} {value}"), r.text


def test_missing_things_are_404s_and_a_root_needs_a_base(
    sapi: Api, project: dict[str, Any]
) -> None:
    base = f"/projects/{project['pid']}/branches"
    r = sapi.http.get(f"{base}/{project['migrated']}/schema", params={"db_name": "nope"})
    assert r.status_code == 404, r.text
    r = sapi.http.get(f"{base}/br-missing-123456/schema", params={"db_name": project["db"]})
    assert r.status_code == 404, r.text
    r = sapi.http.get(
        f"{base}/{project['migrated']}/compare_schema",
        params={"db_name": project["db"], "base_branch_id": "br-missing-123456"},
    )
    assert r.status_code == 404, r.text
    r = sapi.http.get(f"{base}/{project['main']}/compare_schema", params={"db_name": project["db"]})
    assert r.status_code == 400, r.text
    assert "base_branch_id" in r.json()["message"]


def test_a_schema_past_the_bound_is_a_422(sapi: Api, project: dict[str, Any]) -> None:
    _sql(project["main_uri"], f"COMMENT ON TABLE customers IS '{'x' * MAX_BYTES}'")
    try:
        r = sapi.http.get(
            f"/projects/{project['pid']}/branches/{project['main']}/schema",
            params={"db_name": project["db"]},
        )
        assert r.status_code == 422, r.text
        assert r.json()["code"] == "SCHEMA_SIZE_LIMIT_EXCEEDED"
        assert str(MAX_BYTES) in r.json()["message"]
    finally:
        _sql(project["main_uri"], "COMMENT ON TABLE customers IS NULL")


@pytest.fixture(scope="module")
def neonctl(schema_server: Server, sapi: Api, tmp_path_factory: pytest.TempPathFactory) -> Neonctl:
    workdir: Path = tmp_path_factory.mktemp("neonctl-schema")
    return Neonctl(install(), schema_server.base_url, sapi.key, workdir)


def test_neonctl_branches_schema_diff(neonctl: Neonctl, project: dict[str, Any]) -> None:
    pid, db = project["pid"], project["db"]
    out = neonctl.run(
        "branches", "schema-diff", "main", "migrated", "--project-id", pid, "--database", db
    ).stdout
    assert "+CREATE TABLE public.orders (" in out, out
    same = neonctl.run(
        "branches", "schema-diff", "main", "same", "--project-id", pid, "--database", db
    ).stdout
    assert "+CREATE" not in same and "-CREATE" not in same, same


def test_neonctl_diff(neonctl: Neonctl, project: dict[str, Any]) -> None:
    pid = project["pid"]
    done = neonctl.run("diff", "main", "--branch", "migrated", "--project-id", pid)
    assert "+CREATE TABLE public.orders (" in done.stdout, done
    assert "No schema differences" not in done.stdout + done.stderr
    done = neonctl.run("diff", "--branch", "same", "--project-id", pid)
    assert "No schema differences" in done.stdout + done.stderr, done
    assert "+CREATE" not in done.stdout
