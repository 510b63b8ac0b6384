"""Compute units as Postgres settings: the mapping, and what a started compute reports."""

from __future__ import annotations

import dataclasses
import math

import pytest
from compute_helpers import DATABASE, ROLE, Computes, free_port, query

from pgplane.compute.driver import ComputeError, ComputeSpec
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.postgres.pidfile import read_pid_file
from pgplane.compute.local.postgres.sizing import compute_settings, cu_settings

# Neon's published max_connections by compute size.
NEON_MAX_CONNECTIONS = {
    0.25: 112,
    0.5: 225,
    1: 450,
    2: 901,
    3: 1351,
    4: 1802,
    5: 2253,
    6: 2703,
    7: 3154,
    8: 3604,
    9: 4000,
    10: 4000,
    56: 4000,
}


@pytest.mark.parametrize(("cu", "connections"), NEON_MAX_CONNECTIONS.items())
def test_max_connections_follow_neons_table(cu: float, connections: int) -> None:
    assert cu_settings(cu)["max_connections"] == str(connections)


def test_memory_scales_with_the_compute_size() -> None:
    assert cu_settings(0.25) == {
        "max_connections": "112",
        "shared_buffers": "32MB",
        "effective_cache_size": "768MB",
        "maintenance_work_mem": "16MB",
        "work_mem": "4MB",
    }
    one = cu_settings(1)
    assert one["shared_buffers"] == "128MB"
    assert one["effective_cache_size"] == "3072MB"
    assert one["maintenance_work_mem"] == "64MB"
    assert cu_settings(0.1)["maintenance_work_mem"] == "16MB"  # the floor
    assert cu_settings(0.01)["max_connections"] == "25"  # the floor
    assert cu_settings(0.3)["shared_buffers"] == "39321kB"  # not a whole MB: in kB


@pytest.mark.parametrize("cu", [0, -1, math.nan, math.inf])
def test_nonsense_sizes_are_refused(cu: float) -> None:
    with pytest.raises(ComputeError, match="invalid compute size"):
        cu_settings(cu)


def test_user_settings_override_the_derived_ones() -> None:
    settings = compute_settings(1, {"Shared_Buffers": "1GB", "work_mem": "64MB", "jit": "off"})
    assert settings["Shared_Buffers"] == "1GB"
    assert "shared_buffers" not in settings  # one value per setting, whatever its case
    assert settings["work_mem"] == "64MB"
    assert settings["jit"] == "off"
    assert settings["max_connections"] == "450"


async def test_a_compute_runs_with_the_settings_of_its_size(
    driver: LocalComputeDriver, computes: Computes
) -> None:
    version = driver.pg_versions()[-1]
    await driver.create_timeline(
        project_id="proj-size",
        branch_id="br-main",
        pg_version=version,
        roles=[ROLE],
        databases=[DATABASE],
    )
    small = ComputeSpec(
        project_id="proj-size",
        branch_id="br-main",
        endpoint_id="ep-size",
        pg_version=version,
        port=free_port(),
    )
    await computes.start(small)
    show = "SELECT current_setting('max_connections'), current_setting('shared_buffers')"
    assert await query(small.port, show) == [("112", "32MB")]
    first = read_pid_file(driver.pgdata("proj-size", "br-main"))

    # A new size is a new command line: the compute restarts with it.
    bigger = dataclasses.replace(small, autoscaling_limit_min_cu=0.25, autoscaling_limit_max_cu=1)
    await computes.start(bigger)
    assert await query(bigger.port, show) == [("450", "128MB")]
    second = read_pid_file(driver.pgdata("proj-size", "br-main"))
    assert first is not None
    assert second is not None
    assert first.pid != second.pid

    overridden = dataclasses.replace(bigger, pg_settings={"max_connections": "50"})
    await computes.start(overridden)
    assert await query(overridden.port, show) == [("50", "128MB")]
