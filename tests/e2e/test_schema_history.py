"""A branch's schema at a point of its history (``lsn`` / ``timestamp`` on ``…/schema``, and the
base's on ``…/compare_schema``) against a real server: before a migration the table is not
there, the diff shows it, bad points are 400s naming the parameter, the temporary data directory
is gone afterwards and a suspended compute stays asleep."""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import Api, Server, running_server


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(
        PGPLANE_HISTORY_SECONDS="1", PGPLANE_HISTORY_BASE_BYTES=str(48 << 20)
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key(f"pit-schema-{time.monotonic_ns()}")
    with Api(server, key) as client:
        yield client


def _point(uri: str) -> tuple[str, str]:
    """Postgres' clock and LSN now (RFC 3339 and ``0/16B3748``)."""
    with psycopg.connect(uri, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text, clock_timestamp()").fetchone()
    assert row is not None
    moment: datetime.datetime = row[1]
    return moment.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z"), str(row[0])


@pytest.fixture(scope="module")
def project(api: Api) -> dict[str, Any]:
    created = api.create_ready_project(name="pit-schema")
    uri = created["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE customers (id int PRIMARY KEY)")
    when, lsn = _point(uri)
    time.sleep(0.05)
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id bigint PRIMARY KEY)")
    return {
        "pid": created["project"]["id"],
        "branch": created["branch"]["id"],
        "endpoint": created["endpoints"][0]["id"],
        "db": created["databases"][0]["name"],
        "uri": uri,
        "when": when,
        "lsn": lsn,
    }


def _get(api: Api, p: dict[str, Any], what: str, **params: str) -> Any:
    return api.http.get(
        f"/projects/{p['pid']}/branches/{p['branch']}/{what}",
        params={"db_name": p["db"], **params},
        timeout=300,
    )


def _schema(api: Api, p: dict[str, Any], **params: str) -> str:
    r = _get(api, p, "schema", **params)
    assert r.status_code == 200, r.text
    return str(r.json()["sql"])


def test_the_schema_before_a_migration_lacks_its_table(
    api: Api, server: Server, project: dict[str, Any]
) -> None:
    head = _schema(api, project)
    assert "CREATE TABLE public.orders (" in head
    for point in ({"lsn": project["lsn"]}, {"timestamp": project["when"]}):
        sql = _schema(api, project, **point)
        assert "CREATE TABLE public.customers (" in sql, point
        assert "orders" not in sql, point
    diff = _get(
        api,
        project,
        "compare_schema",
        base_branch_id=project["branch"],
        base_lsn=project["lsn"],
    )
    assert diff.status_code == 200, diff.text
    assert "+CREATE TABLE public.orders (" in diff.json()["diff"]
    back = _get(
        api,
        project,
        "compare_schema",
        base_branch_id=project["branch"],
        timestamp=project["when"],
    )
    assert "-CREATE TABLE public.orders (" in back.json()["diff"]
    # Nothing of the rebuilt points is left in the branch's directory.
    branch_dir = server.data_dir / "projects" / project["pid"] / "branches" / project["branch"]
    assert not [p.name for p in branch_dir.iterdir() if p.name.startswith("point-")]


def test_a_suspended_compute_is_not_woken(api: Api, project: dict[str, Any]) -> None:
    pid, ep = project["pid"], project["endpoint"]
    api.suspend(pid, ep)
    before = len(api.operations(pid))
    assert "orders" not in _schema(api, project, lsn=project["lsn"])
    assert api.endpoint(pid, ep)["current_state"] == "idle"
    assert len(api.operations(pid)) == before


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"lsn": "FF/0"}, "lsn", "never had"),
        ({"lsn": "0/0"}, "lsn", "no LSN"),
        ({"lsn": "nonsense"}, "lsn", "must be an LSN"),
        ({"timestamp": "2999-01-01T00:00:00Z"}, "timestamp", "in the future"),
        ({"timestamp": "2020-01-01T00:00:00Z"}, "timestamp", "before branch"),
        ({"timestamp": "2026-01-01T00:00:00"}, "timestamp", "time zone"),
        ({"lsn": "0/1", "timestamp": "2020-01-01T00:00:00Z"}, "lsn", "not both"),
    ],
)
def test_bad_points_are_400s_naming_the_parameter(
    api: Api, project: dict[str, Any], params: dict[str, str], field: str, words: str
) -> None:
    r = _get(api, project, "schema", **params)
    assert r.status_code == 400, r.text
    assert field in r.json()["message"], r.text
    assert words in r.json()["message"], r.text
    base = {f"base_{k}": v for k, v in params.items()}
    r = _get(api, project, "compare_schema", base_branch_id=project["branch"], **base)
    assert r.status_code == 400, r.text
    assert f"base_{field}" in r.json()["message"], r.text
