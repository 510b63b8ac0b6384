"""A pull request's database branch, through the calls Neon's actions make with Neon's client.

create-branch-action 6 finds the PR's branch by name or creates it (annotated with the PR, with
an expiry), then reads its endpoint, database, role and password to build the URLs it outputs;
schema-diff-action 1 reads both branches' schemas and compares them; delete-branch-action 3
finds the branch by name and deletes it. ``tests/js/preview-actions.cjs`` makes those calls
through ``@neondatabase/api-client`` with the actions' arguments (``limit: 10000`` on the
search, ``role`` on the schema read, the ``-pooler`` host) and this test uses what they return
as a workflow's later steps would: the URL connects, a migration shows in the diff, the branch
goes when the PR closes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests import apiclient
from tests.support import Api, Server, running_server, wait_for

SCRIPT = (Path(__file__).parent.parent / "js" / "preview-actions.cjs").read_text()
GITHUB = {
    "github-commit-repo": "acme/shop",
    "github-commit-author-login": "octocat",
    "github-pr-number": "42",
    "github-pr-title": "Add a column",
    "github-commit-ref": "feature/column",
}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("previews@example.com")
    with Api(server, key) as client:
        yield client


def _action(server: Server, api: Api, step: str, **inputs: str) -> Any:
    env = {"NEON_API_KEY": api.key, "API_HOST": server.base_url, **inputs}
    return apiclient.run(apiclient.install(), SCRIPT, env, timeout=120, args=[step])


def _connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    # The URL as the action outputs it: ep-….<proxy host>:<port>, TLS required; hostaddr
    # because *.localhost may not resolve here (the name still goes in SNI, which routes).
    return psycopg.connect(url, hostaddr="127.0.0.1", connect_timeout=30)


def test_a_pull_request_s_branch_from_open_to_close(server: Server, api: Api) -> None:
    body = api.create_ready_project(name="shop")
    pid = body["project"]["id"]
    with psycopg.connect(body["connection_uris"][0]["connection_uri"]) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, total numeric)")
        conn.execute("INSERT INTO orders VALUES (1, 9.5)")
    common = {"PROJECT_ID": pid, "DATABASE": "neondb", "ROLE": "neondb_owner"}
    expires = (datetime.now(UTC) + timedelta(days=2)).replace(microsecond=0)

    opened = _action(
        server, api, "create", **common, BRANCH_NAME="preview/pr-42",
        PARENT_BRANCH="main", EXPIRES_AT=expires.isoformat().replace("+00:00", "Z"),
        ANNOTATIONS=json.dumps(GITHUB),
    )  # fmt: skip
    assert opened["created"] is True
    assert datetime.fromisoformat(opened["expires_at"]) == expires
    bid = opened["branch_id"]
    branch = api.http.get(f"/projects/{pid}/branches/{bid}").json()
    assert branch["annotation"]["value"] == GITHUB
    listed = api.http.get(f"/projects/{pid}/branches").json()
    assert listed["annotations"][bid]["value"]["github-pr-number"] == "42"
    wait_for(
        "the branch ready",
        lambda: all(o["status"] == "finished" for o in api.operations(pid)),
        120,
        server=server,
    )

    # Both URLs reach the branch: the pooled host names the same endpoint.
    for url in (opened["db_url"], opened["db_url_pooled"]):
        with _connect(url) as conn:
            assert conn.execute("SELECT total FROM orders").fetchone() == (9.5,)

    # A second run of the workflow finds the PR's branch instead of making another.
    again = _action(server, api, "create", **common, BRANCH_NAME="preview/pr-42")
    assert again["created"] is False and again["branch_id"] == bid

    before = _action(server, api, "schema-diff", **common, COMPARE_BRANCH="preview/pr-42")
    assert before["same"] is True and "CREATE TABLE public.orders" in before["compare"]
    with _connect(opened["db_url"]) as conn:
        conn.execute("ALTER TABLE orders ADD COLUMN coupon text")
    after = _action(server, api, "schema-diff", **common, COMPARE_BRANCH="preview/pr-42")
    assert after["same"] is False and after["base_id"] == body["branch"]["id"]
    assert "coupon text" in after["compare"] and "coupon" not in after["base"]

    closed = _action(server, api, "delete", PROJECT_ID=pid, BRANCH="preview/pr-42")
    assert closed["status"] == 200 and closed["deleted"] == bid
    assert "delete_timeline" in closed["operations"]
    assert api.http.get(f"/projects/{pid}/branches/{bid}").status_code == 404
