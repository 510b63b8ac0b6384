"""Without cgroups (walls off, or not root), a compute's CPU is its processes' own figures from
/proc: the postmaster's, its living children's and what its exited backends used (issue 23)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support import Api, Server, running_server

BURN = "SELECT sum(sqrt(g)) FROM generate_series(1, 25000000) g"


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(PGPLANE_WALLS="off", PGPLANE_USAGE_SECONDS="0.3") as srv:
        yield srv


def _cpu_seconds(pid: int) -> float:
    """The kernel's figure for one process: its user and system time."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_cpu_used_sec_counts_an_exited_backend_s_cpu(server: Server) -> None:
    _, key = server.create_key("usage-processes@example.com")
    with Api(server, key) as api:
        body = api.create_ready_project(autoscaling_limit_min_cu=1, autoscaling_limit_max_cu=1)
        pid = body["project"]["id"]
        before = api.http.get(f"/projects/{pid}").json()["project"]["cpu_used_sec"]
        uri = body["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, connect_timeout=60, autocommit=True) as conn:
            row = conn.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            conn.execute(BURN)
            burned = _cpu_seconds(int(row[0]))  # the backend's, read while it still lives
        assert burned >= 1.5, burned
        api.suspend(pid, body["endpoints"][0]["id"])
        after = api.http.get(f"/projects/{pid}").json()["project"]["cpu_used_sec"]
        assert after - before >= int(burned), (before, after, burned)
