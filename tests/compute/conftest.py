"""Real Postgres for the compute tests: one data directory and driver per module.

Every postmaster a test starts is stopped at teardown, even when the test fails: first through
the driver, then, as a safety net, any postmaster whose pid file is left under the data dir.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from compute_helpers import Computes, clean_up

from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    # Under /tmp: when the tests run as root the compute user must be able to reach it (the
    # driver adds the search bit on pytest's 0700 directories, and logs that it did).
    path = tmp_path_factory.mktemp("compute")
    yield path
    clean_up(path)


@pytest.fixture(scope="module")
async def driver(data_dir: Path) -> AsyncIterator[LocalComputeDriver]:
    # No sandbox: these tests reach computes over TCP with SCRAM, which a sandboxed compute (its
    # network its own) does not offer; the walls are the e2e tenant-walls suites' (as root).
    drv = LocalComputeDriver(LocalDriverConfig(data_dir=data_dir, walls=False))
    yield drv
    await drv.close()


@pytest.fixture
async def computes(driver: LocalComputeDriver) -> AsyncIterator[Computes]:
    tracker = Computes(driver)
    try:
        yield tracker
    finally:
        await tracker.stop_all()
