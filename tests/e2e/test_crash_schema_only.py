"""``pgplane serve`` killed inside a schema-only branch's build, and what holds after its restart.

Killed once the source is read (``schema_only:read``, with ``-m slow``) or once the new cluster
holds the schema, its temporary postmaster still running on ``pgdata.tmp``
(``schema_only:restored``): the restarted server's retry stops that postmaster, builds again from
nothing, and the branch exists once, with the parent's table and none of its rows, the parent
untouched.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.crash import ROWS, SUM, Crash, assert_consistent, slow


@pytest.mark.parametrize("failpoint", [slow("schema_only:read"), "schema_only:restored"])
def test_kill_inside_a_schema_only_build(crash: Crash, failpoint: str) -> None:
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={
            "branch": {"name": "schema-only", "init_source": "schema-only"},
            "endpoints": [{"type": "read_write"}],
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in body["operations"]])
    assert_consistent(crash.server, crash.api, crash.pid)

    creates = [o for o in crash.ops() if o["action"] == "create_branch"]
    assert [o["status"] for o in creates] == ["finished"], creates
    branches = crash.api.http.get(f"/projects/{crash.pid}/branches").json()["branches"]
    assert sorted(b["init_source"] for b in branches) == ["parent-data", "schema-only"]
    uri = body["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=60) as conn:
        assert conn.execute("SELECT count(*) FROM t").fetchone() == (0,)
    assert crash.rows() == (ROWS, SUM)
