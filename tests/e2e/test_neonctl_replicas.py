"""Neon's CLI adds read-only computes and connects to them (issue 21): ``branches add-compute``
(whose default type is read_only), ``--type read_only`` and ``connection-string
--endpoint-type read_only``, run for real against the server."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg import errors

from tests.e2e.test_neonctl import connect, create_project, default_branch, settle
from tests.neonctl import Neonctl
from tests.support import Api


def test_add_compute_and_connect_to_it(neonctl: Neonctl, api: Api) -> None:
    created = create_project(neonctl, api, "replicas")
    pid = created["project"]["id"]
    bid = default_branch(api, pid)["id"]
    with psycopg.connect(created["connection_uris"][0]["connection_uri"], autocommit=True) as conn:
        conn.execute("CREATE TABLE t AS SELECT 1 AS n")

    default = neonctl.json("branches", "add-compute", bid, "--project-id", pid)
    typed = neonctl.json(
        "branches", "add-compute", bid, "--project-id", pid, "--type", "read_only", "--cu", "0.5"
    )
    settle(api, pid)
    # neonctl 5 sends a name: its <id|name> argument fills yargs' `name` too, so each compute is
    # named after the branch argument. The name is kept, shown back and changed with a PATCH.
    assert api.endpoint(pid, typed["id"])["name"] == bid
    r = api.http.patch(
        f"/projects/{pid}/endpoints/{typed['id']}", json={"endpoint": {"name": "bi"}}
    )
    assert r.status_code == 200 and r.json()["endpoint"]["name"] == "bi", r.text
    settle(api, pid)
    for added in (default, typed):
        assert added["host"].startswith(added["id"])
        assert api.endpoint(pid, added["id"])["type"] == "read_only"
    assert api.endpoint(pid, typed["id"])["autoscaling_limit_max_cu"] == 0.5

    uri = neonctl.run(
        "connection-string", bid, "--project-id", pid, "--endpoint-type", "read_only"
    ).stdout.strip()
    assert str(urlsplit(uri).hostname).split(".")[0] in (default["id"], typed["id"]), uri
    with connect(uri) as conn:
        assert conn.execute("SELECT pg_is_in_recovery(), max(n) FROM t").fetchone() == (True, 1)
        with pytest.raises(errors.ReadOnlySqlTransaction):
            conn.execute("INSERT INTO t VALUES (2)")

    # The read-write one is still the default.
    rw = neonctl.run("connection-string", bid, "--project-id", pid).stdout.strip()
    (primary,) = [
        e
        for e in api.http.get(f"/projects/{pid}/endpoints").json()["endpoints"]
        if e["type"] == "read_write"
    ]
    assert primary["id"] in rw
    with connect(rw) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (False,)
