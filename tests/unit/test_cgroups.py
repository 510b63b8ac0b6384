"""The files a compute's cgroup is made of, on both cgroup versions, written on a made-up tree.

This machine (and CI) has cgroup v1: the e2e suite (tests/e2e/test_walls_sandbox.py) proves the
limits on it with real processes. cgroup v2, what most users' machines have, is checked here:
the same limits become v2's files, pgplane moves itself to a leaf before enabling controllers
(v2 allows none in a cgroup with processes of its own), and a compute's cgroup is killed and
removed.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from pgplane.compute.local.tenants import cgroups as module
from pgplane.compute.local.tenants.autoscale import Autoscaler, next_cpus
from pgplane.compute.local.tenants.cgroups import Cgroups, Limits

GIB = 1 << 30


def _fake_v2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    own = tmp_path / "system.slice" / "pgplane.service"
    own.mkdir(parents=True)
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (own / "cgroup.controllers").write_text("cpu io memory pids\n")
    (own / "cgroup.procs").write_text("4242\n4343\n")
    (own / "cgroup.subtree_control").write_text("")
    monkeypatch.setattr(module, "_own_cgroup", lambda _c: "/system.slice/pgplane.service")
    return own


def test_v2_moves_serve_to_a_leaf_and_writes_v2_limits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = _fake_v2(tmp_path, monkeypatch)
    found = Cgroups._v2(tmp_path)
    assert found.version == 2
    assert found.parents == (own / "computes",)
    # Our processes moved (one pid per write: the file keeps the last), controllers enabled.
    assert (own / "serve" / "cgroup.procs").read_text() == "4343"
    assert (own / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"
    assert (own / "computes" / "cgroup.subtree_control").read_text() == "+cpu +memory +pids"

    found.create("pg-a", Limits.for_size(0.5, max_connections=225))
    group = own / "computes" / "pg-a"
    assert (group / "cpu.max").read_text() == "50000 100000"
    assert (group / "cpu.weight").read_text() == "50"
    assert (group / "memory.max").read_text() == str(2 * GIB)
    assert (group / "pids.max").read_text() == "325"
    assert found.procs_files("pg-a") == [group / "cgroup.procs"]
    # What an adopted compute's autoscaling starts from (the quota it was left at).
    assert found.quota_cpus("pg-a") == 0.5
    (group / "cpu.max").write_text("max 100000\n")
    assert found.quota_cpus("pg-a") is None
    assert found.quota_cpus("pg-none") is None


def test_v2_refuses_a_cgroup_without_the_controllers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = _fake_v2(tmp_path, monkeypatch)
    (own / "cgroup.controllers").write_text("io\n")
    with pytest.raises(OSError, match="lacks controllers"):
        Cgroups._v2(tmp_path)


def test_v1_writes_each_hierarchy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for controller in ("cpu", "memory", "pids"):
        (tmp_path / controller).mkdir()
    monkeypatch.setattr(module, "_own_cgroup", lambda _c: "/")
    found = Cgroups._v1(tmp_path)
    assert found.version == 1
    found.create("pg-b", Limits.for_size(2, max_connections=901))
    cpu = tmp_path / "cpu" / "pgplane-computes" / "pg-b"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert (cpu / "cpu.shares").read_text() == "2048"
    memory = tmp_path / "memory" / "pgplane-computes" / "pg-b"
    assert (memory / "memory.limit_in_bytes").read_text() == str(8 * GIB)
    assert (tmp_path / "pids" / "pgplane-computes" / "pg-b" / "pids.max").read_text() == "1001"


def test_a_process_forked_between_its_parents_moves_joins_every_hierarchy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 moves a process one hierarchy at a time: a child its postmaster forked after the move
    into cpu and before the move into memory is born in the compute's cpu cgroup and outside
    its memory cgroup. It is moved into memory too, not taken as joined (a tenant's backends,
    forked by it, would have had no memory cap)."""
    groups = {c: tmp_path / c / "pg-d" for c in ("cpu", "memory", "pids")}
    for group in groups.values():
        group.mkdir(parents=True)
    groups["cpu"].joinpath("cgroup.procs").write_text("100\n101\n")  # 101: forked meanwhile
    groups["memory"].joinpath("cgroup.procs").write_text("100\n")
    groups["pids"].joinpath("cgroup.procs").write_text("100\n")

    def move(procs: Path, pid: int) -> None:  # as the kernel lists a process moved in
        procs.write_text(procs.read_text() + f"{pid}\n")

    monkeypatch.setattr(module, "_tree", lambda root: {100, 101})
    monkeypatch.setattr(module, "_move", move)
    found = Cgroups(version=1, parents=tuple(tmp_path / c for c in ("cpu", "memory", "pids")))
    found.join_tree("pg-d", 100)
    for group in groups.values():
        assert group.joinpath("cgroup.procs").read_text().split() == ["100", "101"]


def test_killing_an_empty_cgroup_removes_it(tmp_path: Path) -> None:
    parent = tmp_path / "computes"
    (parent / "pg-c").mkdir(parents=True)
    found = Cgroups(version=2, parents=(parent,))
    found.kill("pg-c")
    assert not (parent / "pg-c").exists()
    found.kill("pg-c")  # again: nothing there, nothing to do


def test_autoscaling_grows_a_busy_compute_and_shrinks_an_idle_one() -> None:
    # Busy (used most of its quota): by half, at least a quarter CU, never past the maximum.
    assert next_cpus(0.25, 0.25, 2, used=0.25) == 0.5
    assert next_cpus(1, 0.25, 2, used=0.9) == 1.5
    assert next_cpus(1.5, 0.25, 2, used=1.5) == 2
    assert next_cpus(2, 0.25, 2, used=2) == 2
    # Idle: by a third, never under the minimum; in between, as it is.
    assert next_cpus(2, 0.25, 2, used=0) == pytest.approx(4 / 3)
    assert next_cpus(0.3, 0.25, 2, used=0) == 0.25
    assert next_cpus(1, 0.25, 2, used=0.5) == 1


class _Counted:
    """A compute's CPU time as its cgroup would count it, and the quotas set on it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.set: list[float] = []

    def cpu_seconds(self, _name: str) -> float:
        return self.seconds

    def set_cpus(self, _name: str, cpus: float) -> None:
        self.set.append(cpus)


async def test_autoscaling_reads_use_over_the_time_that_passed_not_the_nominal_interval() -> None:
    # A late tick (a busy machine's): 1 CPU-second over 4 s is a quarter CPU, idle enough to
    # shrink a 1-CPU compute; over the nominal 2 s it would have read as half, and stayed.
    counted, now = _Counted(), [100.0]
    scaler = Autoscaler(cast("Cgroups", counted), clock=lambda: now[0])
    scaler.watch("c", Limits(cpus=1, memory_bytes=GIB, processes=64, min_cpus=0.25, max_cpus=1))
    scaler._tick()  # the first look: nothing to compare with
    counted.seconds, now[0] = 1.0, 104.0
    scaler._tick()
    assert counted.set == [pytest.approx(2 / 3)]
    # On time and busy (1.8 CPU-seconds in 2 s against a 2/3 quota): it grows again.
    counted.seconds, now[0] = 2.8, 106.0
    scaler._tick()
    assert counted.set[-1] == 1
    await scaler.close()  # its own ticks (every 2 s) never came: this test's ran instead
