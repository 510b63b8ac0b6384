"""A compute's sandbox and cgroup, tried from the tenant's own shell (issue 20, findings 5 and 7).

Project A's tenant holds its compute's OS user (superuser made by hand, as a CVE would; see
test_walls_os.py). From its shell it leaves processes running and suspends; opens TCP
connections to the platform's API and proxy; burns CPU and eats memory. Nothing of it outlives
its compute, no TCP port of the machine answers it, its CPU is throttled at its compute units
and its memory capped, and project B's queries and the API answer meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from pgplane.compute.local.postgres.records import Records, is_alive
from pgplane.compute.local.tenants.cgroups import Cgroups
from pgplane.compute.local.tenants.walls import cgroup_name
from tests.e2e.test_walls_os import Project, allowed, make_superuser, refused, run_program
from tests.support import Api, Server, running_server, wait_for

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="sandboxes and cgroups need root (as anyone else, none exists)"
)

SLOW = 5.0  # seconds: slower than this while a tenant burns CPU counts as starved


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    with running_server() as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("walls-sandbox@example.com")
    with Api(server, key) as client:
        yield client


@pytest.fixture(scope="module")
def tenant(api: Api, server: Server) -> Project:
    a = Project(server, api.create_ready_project(name="sandboxed"))
    make_superuser(a)
    return a


def _processes_of(user: str) -> list[str]:
    uid = pwd.getpwnam(user).pw_uid
    done = subprocess.run(["pgrep", "-u", str(uid)], capture_output=True, text=True, check=False)
    return done.stdout.split()


def test_the_server_says_computes_are_walled(server: Server) -> None:
    assert "computes run sandboxed" in server.log()
    assert "computes run in cgroups" in server.log()


def test_nothing_of_a_tenant_outlives_its_compute(api: Api, tenant: Project) -> None:
    allowed(tenant, "true && (setsid sleep 600 >/dev/null 2>&1 &)")
    allowed(tenant, "true && (nohup sh -c 'while :; do sleep 1; done' >/dev/null 2>&1 &)")
    assert len(_processes_of(tenant.user)) > 2  # the postmaster's and the tenant's own
    api.suspend(tenant.id, tenant.endpoint_id)
    wait_for("every process of the tenant gone", lambda: not _processes_of(tenant.user))
    assert tenant.query("SELECT 1") == [(1,)]  # woken again, as any connection wakes it


def test_no_tcp_port_of_the_machine_answers_a_tenant(server: Server, tenant: Project) -> None:
    script = (
        "import socket, sys\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=3)\n"
        "except OSError as e:\n"
        "    print(e); sys.exit(1)\n"
    )
    for port in (server.port, server.proxy_port):
        # The control: the same port answers the platform's own side.
        with httpx.Client(timeout=5) as client:
            assert client.get(f"http://127.0.0.1:{server.port}/livez").status_code == 200
        out = refused(tenant, f'python3 -c "{script}" {port}')
        assert "unreachable" in out or "refused" in out, out
    # Its own network holds only a loopback of its own, and no route out.
    assert "unreachable" in refused(
        tenant, f'python3 -c "{script.replace("127.0.0.1", "10.0.0.1")}" 80'
    )


def _cgroup(tenant: Project) -> tuple[Cgroups, str]:
    cgroups, said = Cgroups.find()
    assert cgroups is not None, said
    return cgroups, cgroup_name(tenant.pgdata)


def _cpu_throttled_us(cgroups: Cgroups, name: str) -> int:
    group = cgroups.parents[0] / name
    stat = (group / "cpu.stat").read_text()
    fields = dict(line.split() for line in stat.splitlines())
    return int(fields.get("throttled_usec", int(fields.get("throttled_time", "0")) // 1000))


def test_a_cpu_burner_is_throttled_at_its_compute_units(
    api: Api, server: Server, tenant: Project, other: Project
) -> None:
    tenant.query("SELECT 1")  # running
    cgroups, name = _cgroup(tenant)
    quota = _quota(cgroups, name)
    assert quota == 0.25  # the default size, 0.25 CU: a quarter of a CPU
    before = _cpu_throttled_us(cgroups, name)
    burn = "while :; do :; done"
    allowed(tenant, f"true && (for i in 1 2 3 4; do timeout 6 sh -c '{burn}' & done) >/dev/null")
    started = time.monotonic()
    while time.monotonic() - started < 4:
        began = time.monotonic()
        assert other.query("SELECT count(*) FROM pg_catalog.pg_class")[0][0] > 0
        assert httpx.get(f"http://127.0.0.1:{server.port}/livez", timeout=SLOW).status_code == 200
        assert time.monotonic() - began < SLOW
        time.sleep(0.3)
    assert _cpu_throttled_us(cgroups, name) > before  # the kernel held it to its quota


def test_a_compute_s_cpu_moves_within_its_range_with_its_load(api: Api, server: Server) -> None:
    """Autoscaling: 0.25 to 0.5 CU. Idle, it settles to its minimum; burning, it grows to its
    maximum, without a restart. (The steps between, over wider ranges, are unit-tested.)"""
    body = api.create_ready_project(name="autoscaled")
    scaled = Project(server, body)
    make_superuser(scaled)
    change = {"endpoint": {"autoscaling_limit_min_cu": 0.25, "autoscaling_limit_max_cu": 0.5}}
    api.settled(
        scaled.id,
        api.http.patch(f"/projects/{scaled.id}/endpoints/{scaled.endpoint_id}", json=change),
    )
    scaled.query("SELECT 1")
    cgroups, name = _cgroup(scaled)
    postmaster, _ = scaled.postmaster()
    wait_for("the idle compute at its minimum", lambda: _quota(cgroups, name) == 0.25, timeout=30)
    _burn_until(scaled, "the busy compute at its maximum", lambda: _quota(cgroups, name) == 0.5)
    assert scaled.postmaster()[0] == postmaster  # the same postmaster throughout
    api.suspend(scaled.id, scaled.endpoint_id)


def test_a_memory_eater_is_capped_at_its_compute_units(tenant: Project, other: Project) -> None:
    tenant.query("SELECT 1")
    cgroups, name = _cgroup(tenant)
    for pid in _processes_of(tenant.user):  # each in the compute's cgroup of every controller
        with contextlib.suppress(FileNotFoundError):  # one that ended meanwhile
            lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
            memory = [line for line in lines if ":memory:" in line]  # v1
            memory = memory or [line for line in lines if line.startswith("0::")]  # v2
            assert memory and all(line.endswith(f"/{name}") for line in memory), (pid, lines)
    # tail keeps a line in memory until its end: /dev/zero has none. Ended at 1 GiB (0.25 CU).
    rc, out = run_program(tenant, "timeout 60 tail /dev/zero")
    assert rc == 128 + 9, (rc, out)  # SIGKILL, from the kernel's OOM killer; 124 is the timeout
    limit = _memory_limit(cgroups, name)
    assert limit == 1 << 30
    assert other.query("SELECT 1") == [(1,)]


@pytest.fixture(scope="module")
def other(server: Server) -> Iterator[Project]:
    _, key = server.create_key("walls-sandbox-other@example.com")
    with Api(server, key) as client:
        yield Project(server, client.create_ready_project(name="neighbour"))


def _burn_until(project: Project, what: str, grown: Callable[[], bool]) -> None:
    """Four CPU burners in the compute until ``grown``: a compute grows when it used most of its
    quota over a tick, CPU a busy machine (the other test process' load) may not give it for a
    while, so they go on for up to 180 s, and end with the compute. (Growing from 0.75 CPU to 1
    asked 0.6 CPU of a loaded machine in 30 s, and once was not given it.)"""
    burn = "while :; do :; done"
    allowed(project, f"true && (for i in 1 2 3 4; do timeout 180 sh -c '{burn}' & done) >/dev/null")
    wait_for(what, grown, timeout=180)


def _quota(cgroups: Cgroups, name: str) -> float:
    group = cgroups.parents[0] / name
    if cgroups.version == 2:
        quota, period = (group / "cpu.max").read_text().split()
    else:
        quota = (group / "cpu.cfs_quota_us").read_text()
        period = (group / "cpu.cfs_period_us").read_text()
    return int(quota) / int(period)


def _memory_limit(cgroups: Cgroups, name: str) -> int:
    if cgroups.version == 2:
        return int((cgroups.parents[0] / name / "memory.max").read_text())
    memory = next(p for p in cgroups.parents if "memory" in p.parts)
    return int((memory / name / "memory.limit_in_bytes").read_text())


def test_the_sandbox_has_no_view_of_the_platform(server: Server, tenant: Project) -> None:
    data = server.data_dir.resolve()
    for path in (data / "pgplane.db", data / "logs", data / "postmasters", Path("/root")):
        refused(tenant, f"ls {path}")
    users = allowed(tenant, "cat /etc/passwd")
    assert users.count("\n") <= 1 and tenant.user in users  # root and itself, no other tenant
    assert allowed(tenant, "hostname") == "compute"


def test_a_compute_that_died_on_its_own_leaves_no_cgroup_once_its_branch_is_gone(
    api: Api, server: Server
) -> None:
    doomed = Project(server, api.create_ready_project(name="dies"))
    cgroups, name = _cgroup(doomed)
    assert (cgroups.parents[0] / name).is_dir()
    record = Records(doomed.records).get(doomed.pgdata)
    assert record is not None
    os.kill(record.leader, signal.SIGKILL)  # the sandbox's pid 1: everything in it ends
    wait_for("the compute gone", lambda: not is_alive(record))
    api.settled(doomed.id, api.http.delete(f"/projects/{doomed.id}"))
    assert not any((parent / name).exists() for parent in cgroups.parents)


def test_autoscaling_goes_on_for_a_compute_adopted_after_a_restart(
    api: Api, server: Server
) -> None:
    """Last in the file: it restarts the server. Its computes run on, and the new server takes
    up their autoscaling where the platform's records leave it."""
    scaled = Project(server, api.create_ready_project(name="adopted"))
    make_superuser(scaled)
    change = {"endpoint": {"autoscaling_limit_min_cu": 0.25, "autoscaling_limit_max_cu": 0.5}}
    api.settled(
        scaled.id,
        api.http.patch(f"/projects/{scaled.id}/endpoints/{scaled.endpoint_id}", json=change),
    )
    cgroups, name = _cgroup(scaled)
    wait_for("the idle compute at its minimum", lambda: _quota(cgroups, name) == 0.25, timeout=30)
    postmaster, _ = scaled.postmaster()
    server.stop()
    server.start()
    # A restarted server on a busy machine (a full run's other worker) takes its first looks at
    # the adopted compute later than a quiet one.
    _burn_until(scaled, "the adopted compute at its maximum", lambda: _quota(cgroups, name) == 0.5)
    assert scaled.postmaster()[0] == postmaster  # adopted, not started again
    api.suspend(scaled.id, scaled.endpoint_id)
