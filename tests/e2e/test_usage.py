"""Compute usage is the kernel's own figures, kept across suspends and restarts (issue 23).

A compute burns CPU with a real query; its cgroup's counter, read here straight from the
kernel's file, says how much. The project's and branch's ``cpu_used_sec`` must grow by at least
that once the compute is suspended, stay put while it sleeps, and keep growing over a new run
and over a restart of ``serve`` (the compute adopted, its run taken up where it was).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.tenants.cgroups import Cgroups
from pgplane.compute.local.tenants.walls import cgroup_name
from tests.console import PASSWORD, Browser
from tests.support import Api, Server, run_cli, running_server, wait_for

SAMPLE_SECONDS = 0.3
BURN = "SELECT sum(sqrt(g)) FROM generate_series(1, 25000000) g"  # ~2 s of one CPU here


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server(PGPLANE_USAGE_SECONDS=str(SAMPLE_SECONDS)) as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("usage@example.com")
    with Api(server, key) as client:
        yield client


class Compute:
    def __init__(self, server: Server, body: dict[str, Any]) -> None:
        self.project_id = body["project"]["id"]
        self.branch_id = body["branch"]["id"]
        self.endpoint_id = body["endpoints"][0]["id"]
        self.uri = body["connection_uris"][0]["connection_uri"]
        self.pgdata = Layout(server.data_dir.resolve()).pgdata(self.project_id, self.branch_id)

    def query(self, statement: str) -> None:
        with psycopg.connect(self.uri, connect_timeout=60, autocommit=True) as conn:
            conn.execute(statement)

    def kernel_cpu_seconds(self) -> float:
        """The compute's cgroup's CPU time, from the kernel's file itself."""
        cgroups, said = Cgroups.find()
        assert cgroups is not None, said
        name = cgroup_name(self.pgdata)
        if cgroups.version == 2:
            stat = (cgroups.parents[0] / name / "cpu.stat").read_text()
            return int(dict(line.split() for line in stat.splitlines())["usage_usec"]) / 1e6
        assert len(cgroups.parents) == 4, "no cpuacct hierarchy: v1 without CPU accounting"
        usage = cgroups.parents[-1]  # cpu, memory, pids, then cpuacct
        return int((usage / name / "cpuacct.usage").read_text()) / 1e9


FIELDS = ("cpu_used_sec", "compute_time_seconds", "active_time_seconds")


def _read_figures(api: Api, c: Compute) -> tuple[dict[str, Any], ...]:
    project = api.http.get(f"/projects/{c.project_id}").json()["project"]
    branch = api.http.get(f"/projects/{c.project_id}/branches/{c.branch_id}").json()["branch"]
    listed = api.http.get("/projects").json()["projects"]
    endpoint = api.endpoint(c.project_id, c.endpoint_id)
    (in_list,) = api.http.get(f"/projects/{c.project_id}/endpoints").json()["endpoints"]
    item = next(p for p in listed if p["id"] == c.project_id)
    return project, branch, endpoint, in_list, item


def _figures(api: Api, c: Compute) -> dict[str, int]:
    """The project's figures, once every view of them agrees. While the compute runs a sample
    may land between two of the reads (one every 0.3 s here): those are read again, and any
    disagreement that outlasts the reads is the failure."""
    for _ in range(20):
        project, branch, endpoint, in_list, item = _read_figures(api, c)
        again = api.http.get(f"/projects/{c.project_id}").json()["project"]
        if all(again[f] == project[f] for f in FIELDS):
            break  # no sample landed while reading: the views must agree
    else:
        raise AssertionError("the compute's figures never held still over twenty reads")
    # One branch, one compute: the project's figures are its branch's, the list's the same.
    for field in FIELDS:
        assert branch[field] == project[field], (field, branch, project)
        assert endpoint.get(field, 0) == in_list.get(field, 0) == project[field], field
    assert item["cpu_used_sec"] == project["cpu_used_sec"]
    assert item["active_time"] == project["active_time_seconds"]
    return {f: project[f] for f in FIELDS}


@pytest.fixture(scope="module")
def compute(api: Api, server: Server) -> Compute:
    if os.geteuid() != 0:
        pytest.skip("the kernel's figure for a compute is its cgroup's: cgroups need root")
    body = api.create_ready_project(autoscaling_limit_min_cu=1, autoscaling_limit_max_cu=1)
    return Compute(server, body)


def test_cpu_used_sec_grows_by_what_a_query_burned_and_not_while_suspended(
    server: Server, api: Api, compute: Compute
) -> None:
    compute.query("SELECT 1")
    before = _figures(api, compute)
    kernel_before = compute.kernel_cpu_seconds()
    started = time.monotonic()
    compute.query(BURN)
    wall = time.monotonic() - started
    burned = compute.kernel_cpu_seconds() - kernel_before
    assert burned >= 1.5, f"the query burned only {burned:.2f} s of CPU"
    api.suspend(compute.project_id, compute.endpoint_id)
    after = _figures(api, compute)
    assert after["cpu_used_sec"] - before["cpu_used_sec"] >= int(burned), (before, after, burned)
    # It ran at least as long as the query did, with 1 CU: compute time is that time x 1.
    assert after["active_time_seconds"] - before["active_time_seconds"] >= int(wall)
    assert abs(after["compute_time_seconds"] - after["active_time_seconds"]) <= 1, after
    # Suspended: samples are taken (one starts each tick unless one still runs) and nothing
    # grows.
    server.wait_for_ticks(3)
    assert _figures(api, compute) == after


def test_usage_adds_up_over_a_new_run_and_a_restart_of_serve(
    api: Api, server: Server, compute: Compute
) -> None:
    start = _figures(api, compute)
    compute.query(BURN)  # wakes it: a new run of the compute
    server.stop()  # the compute runs on; the next serve adopts it
    server.start()
    compute.query(BURN)
    kernel_run = compute.kernel_cpu_seconds()  # this run's whole CPU, both burns
    api.suspend(compute.project_id, compute.endpoint_id)
    end = _figures(api, compute)
    assert end["cpu_used_sec"] - start["cpu_used_sec"] >= int(kernel_run), (start, end)
    assert end["active_time_seconds"] > start["active_time_seconds"]


def test_a_compute_that_runs_is_sampled(server: Server, api: Api, compute: Compute) -> None:
    compute.query("SELECT 1")
    start = _figures(api, compute)
    compute.query(BURN)
    burned_total = compute.kernel_cpu_seconds()
    # No suspend: the scheduler's samples bring the figures up while it runs (one each 0.3 s;
    # the wait is long only because CI's other worker may hold both cores). On failure the
    # server's log says whether a sample ran and why it counted nothing.
    wait_for(
        f"the running compute's CPU sampled (from {start}, the kernel counts {burned_total} s)",
        lambda: _figures(api, compute)["cpu_used_sec"] - start["cpu_used_sec"] >= 1,
        server=server,
    )
    assert _figures(api, compute)["cpu_used_sec"] <= start["cpu_used_sec"] + burned_total + 1


def _du(*paths: Path) -> int:
    """What ``du`` says the paths take, in bytes (each inode once, as our own count)."""
    done = subprocess.run(
        ["du", "-s", "-c", "-B1", *(str(p) for p in paths if p.exists())],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.splitlines()[-1].split()[0])


def _near(ours: int | None, theirs: int) -> bool:
    return ours is not None and abs(ours - theirs) <= 0.05 * theirs


def test_a_branch_s_sizes_match_du_and_postgres(api: Api, server: Server) -> None:
    body = api.create_ready_project()
    c = Compute(server, body)
    branch_url = f"/projects/{c.project_id}/branches/{c.branch_id}"

    def branch() -> dict[str, Any]:
        return dict(api.http.get(branch_url).json()["branch"])

    # Where its WAL stands is first seen by a sample: what it writes after counts.
    wait_for("a first sample", lambda: branch().get("logical_size"))
    written_before = branch()["written_data_bytes"]
    with psycopg.connect(c.uri, connect_timeout=60, autocommit=True) as conn:
        start = conn.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"
        ).fetchone()
        conn.execute(
            "CREATE TABLE filler AS SELECT g, repeat('x', 200) AS pad"
            " FROM generate_series(1, 100000) g"
        )
        row = conn.execute(
            "SELECT sum(pg_database_size(oid))::bigint,"
            " (SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'))::bigint FROM pg_database"
        ).fetchone()
    assert row is not None and start is not None
    postgres_says, wal_written = int(row[0]), int(row[1]) - int(start[0])
    assert wal_written > 20 << 20, wal_written  # ~25 MB of rows, WAL-logged

    # Sampled while it runs: the logical size is what Postgres reports (within the 5% a
    # checkpoint or a vacuum moves it by).
    wait_for("the logical size sampled", lambda: _near(branch().get("logical_size"), postgres_says))
    api.suspend(c.project_id, c.endpoint_id)
    branch_dir = c.pgdata.parent
    data_du = _du(c.pgdata)
    history_du = _du(branch_dir / "wal", branch_dir / "base")
    # Suspended, nothing writes: a sample of every branch's storage comes round and matches du.
    wait_for(
        "on-disk sizes matching du",
        lambda: (
            _near(branch().get("on_disk_bytes"), data_du)
            and _near(branch().get("history_bytes"), history_du)
        ),
        server=server,
    )
    shown = branch()
    assert _near(shown["logical_size"], postgres_says)  # kept while it sleeps
    # Its WAL's advance, read as it was suspended: at least what the test wrote.
    assert shown["written_data_bytes"] - written_before >= wal_written
    project = api.http.get(f"/projects/{c.project_id}").json()["project"]
    assert project["on_disk_bytes"] == shown["on_disk_bytes"]
    assert project["history_bytes"] == shown["history_bytes"]
    assert project["synthetic_storage_size"] == shown["logical_size"] + shown["history_bytes"]
    assert project["written_data_bytes"] == shown["written_data_bytes"]


def _usage_cells(page: str) -> list[list[str]]:
    usage = page[page.index('data-testid="usage"') :]
    rows = re.findall(r'<tr[^>]*data-testid="usage-row">(.*?)</tr>', usage, re.S)
    return [re.findall(r"<t[hd][^>]*>(.*?)</t[hd]>", row) for row in rows]


def test_the_console_s_project_page_shows_the_figures(server: Server) -> None:
    email = "usage-console@example.com"
    done = run_cli(
        "accounts", "create", email, "--password-stdin", data_dir=server.data_dir, stdin=PASSWORD
    )
    assert done.returncode == 0, done.stderr
    with Browser(server) as browser:
        assert browser.sign_in(email).status_code == 303
        with Api(server, browser.create_key("usage")) as api:
            body = api.create_ready_project(name="metered")
            c = Compute(server, body)
            url = f"/projects/{c.project_id}/branches/{c.branch_id}"
            # The logical size is asked of a running compute, by a sample while it runs.
            wait_for(
                "the logical size sampled",
                lambda: api.http.get(url).json()["branch"].get("logical_size"),
            )
            api.suspend(c.project_id, c.endpoint_id)

            def shown() -> list[list[str]] | None:
                page = browser.get(f"/console/projects/{c.project_id}")
                assert page.status_code == 200, page.text
                cells = _usage_cells(page.text)
                on_disk = api.http.get(url).json()["branch"]["on_disk_bytes"]
                # Equal unless a sample landed between the two reads: then read both again.
                return cells if cells[1][5] == f"{on_disk / 1024**2:.1f} MiB" else None

            cells = wait_for("the page showing the branch's figures", shown)
    assert len(cells) == 2, cells  # the project, its one branch
    assert cells[0][0] == "Project" and cells[1][0] == body["branch"]["name"]
    assert all("CU-h" in row[2] for row in cells)
    assert cells[0][5] == cells[1][5], cells  # one branch: the project's sum is its figure
    assert "not known yet" not in cells[1][4]  # the logical size, kept while it sleeps


def test_a_deleted_compute_s_use_stays_counted(api: Api, server: Server) -> None:
    if os.geteuid() != 0:
        pytest.skip("the kernel's figure for a compute is its cgroup's: cgroups need root")
    c = Compute(
        server, api.create_ready_project(autoscaling_limit_min_cu=1, autoscaling_limit_max_cu=1)
    )
    c.query(BURN)
    burned = c.kernel_cpu_seconds()  # the run's whole CPU so far
    r = api.http.delete(f"/projects/{c.project_id}/endpoints/{c.endpoint_id}")
    assert r.status_code == 200, r.text
    ops = api.wait_operations(c.project_id, [o["id"] for o in r.json()["operations"]])
    assert [o["status"] for o in ops] == ["finished"], ops
    project = api.http.get(f"/projects/{c.project_id}").json()["project"]
    assert project["cpu_used_sec"] >= int(burned), (project["cpu_used_sec"], burned)
