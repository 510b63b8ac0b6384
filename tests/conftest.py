"""Fixtures shared by every suite: one real server per backend and test process, accounts made
with the CLI."""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.crash import crash  # noqa: F401 - the crash suites' fixture
from tests.support import Api, Server, running_server

if TYPE_CHECKING:
    from pgplane.store import Store
    from tests.neonctl import Installation, Neonctl

_accounts = itertools.count()


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist each worker's servers take compute ports of their own part of the
    default range: two servers of one machine would otherwise pick the same free port at once."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...
    if worker and "PGPLANE_COMPUTE_PORTS" not in os.environ:
        low = 20000 + 400 * int(worker.removeprefix("gw"))
        os.environ["PGPLANE_COMPUTE_PORTS"] = f"{low}-{low + 399}"
    _an_old_major()


def _an_old_major() -> None:
    """Postgres 15 for the suites of older majors where the machine has none (a fresh one):
    Debian's, unpacked (tests/oldpg.py), found as ``serve`` finds any through
    ``PGPLANE_PG_BIN_DIRS``. Done before the workers start, which inherit the setting."""
    from pgplane.compute.local.postgres.binaries import discover
    from tests import oldpg

    configured = [p for p in os.environ.get("PGPLANE_PG_BIN_DIRS", "").split(os.pathsep) if p]
    if any(major <= oldpg.MAJOR for major in discover([Path(p) for p in configured])):
        return
    try:
        found = oldpg.ensure()
    except oldpg.Unavailable as exc:
        # Its suites then say they were skipped, and why, in the summary.
        oldpg.why_not = str(exc)
        return
    os.environ["PGPLANE_PG_BIN_DIRS"] = os.pathsep.join([*configured, str(found)])


@pytest.fixture(scope="session", autouse=True)
def _store_cluster() -> Iterator[None]:
    """The PostgreSQL store's cluster is started by the first test that needs one (one per test
    process); stopped here, with the session."""
    yield
    from tests.pgstore import stop_store_cluster

    stop_store_cluster()


@pytest.fixture(params=["sqlite", "postgresql"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A fresh store of each backend in turn, for the tests of the store contract."""
    from tests.stores import new_location, open_at

    store = await open_at(new_location(request.param, tmp_path))
    yield store
    await store.close()


# The backend of the shared servers and of every server a test starts without naming one.
DEFAULT_STORE = os.environ.get("PGPLANE_TEST_STORE", "sqlite")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked ``both_stores`` (or in a module marked so) that runs on a store (``server``,
    ``api``, ``crash``: whatever asks for ``store_backend``) runs once on each backend, its
    module's tests grouped by backend, so each group shares its module's fixtures.

    ``both_stores(postgresql="slow")``: the PostgreSQL run is ``-m slow`` (a client's flows,
    whose store calls the store's own suites check on both backends: twice the minutes in CI
    for nothing the store suites miss)."""
    marker = metafunc.definition.get_closest_marker("both_stores")
    if "store_backend" in metafunc.fixturenames and marker is not None:
        from tests.stores import BACKENDS

        backends = [
            pytest.param(name, marks=pytest.mark.slow)
            if marker.kwargs.get(name) == "slow"
            else name
            for name in BACKENDS
        ]
        metafunc.parametrize("store_backend", backends, indirect=True, scope="module")


# The files that take longest, longest first (seconds of test time on a clean run: 268, 142,
# 140, 130, 108, 106, 105, 87, 81, 81). They start first, so none starts last while the other
# test process idles: pytest-xdist's own order (--no-loadscope-reorder in scripts/test turns it
# off) puts files with few tests last, schemathesis' one 270 s test among them. The rest follow,
# most tests first (xdist's rule). Simulated on two clean runs' timings: 3 min less than xdist's.
LONGEST = (
    "tests/e2e/test_schemathesis.py",
    "tests/e2e/test_crash.py",
    "tests/e2e/test_snapshots.py",
    "tests/e2e/test_neonctl.py",
    "tests/e2e/test_walls_shared.py",
    "tests/e2e/test_crash_data.py",
    "tests/e2e/test_scale_to_zero.py",
    "tests/e2e/test_walls_tenant_files.py",
    "tests/e2e/test_isolation.py",
    "tests/e2e/test_walls_sandbox.py",
    "tests/e2e/test_object_store.py",
    "tests/e2e/test_bench_object_store.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest files first, then by number of tests (each file's own order kept: the sort is
    stable and its tests share one key)."""
    root = Path(__file__).resolve().parent.parent
    if stale := [path for path in LONGEST if not (root / path).is_file()]:
        raise pytest.UsageError(f"tests/conftest.py LONGEST names files that are gone: {stale}")

    def file(item: pytest.Item) -> str:
        return item.nodeid.partition("::")[0]

    tests = collections.Counter(file(item) for item in items)
    rank = {path: i for i, path in enumerate(LONGEST)}
    items.sort(key=lambda item: (rank.get(file(item), len(LONGEST)), -tests[file(item)]))


@pytest.fixture(scope="module")
def store_backend(request: pytest.FixtureRequest) -> str:
    """The backend the module's servers run on: each in turn under ``both_stores``."""
    return str(getattr(request, "param", DEFAULT_STORE))


@pytest.fixture(scope="session")
def _shared_servers() -> Iterator[Callable[[str], Server]]:
    """One shared server per backend and test process, started when first asked for; the
    PostgreSQL one on a database of this process's store cluster."""
    with contextlib.ExitStack() as stack:
        started: dict[str, Server] = {}

        def shared(backend: str) -> Server:
            if backend not in started:
                from tests.stores import server_store

                started[backend] = stack.enter_context(running_server(store=server_store(backend)))
            return started[backend]

        yield shared
        for srv in started.values():
            assert_operations_settled(srv)


@pytest.fixture(scope="module")
def server(store_backend: str, _shared_servers: Callable[[str], Server]) -> Server:
    """The shared server of the module's backend (``PGPLANE_TEST_STORE``, SQLite by default;
    each in turn for a module marked ``both_stores``)."""
    return _shared_servers(store_backend)


def assert_operations_settled(srv: Server, timeout: float = 120) -> None:
    """Every operation any test started has finished: none left behind, none failed.

    Read straight from the store, so operations no test polled are checked too.
    """
    from tests.stores import store_sql

    db = store_sql(srv)
    deadline = time.monotonic() + timeout
    while True:
        unsettled = db.rows(
            "SELECT project_id, action, status FROM operations"
            " WHERE status IN ('scheduling', 'running')"
        )
        if not unsettled or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    failed = db.rows("SELECT project_id, action, error FROM operations WHERE status = 'failed'")
    assert not unsettled, f"operations left unsettled: {unsettled}"
    assert not failed, f"operations failed: {failed}"


@pytest.fixture
def api(server: Server) -> Iterator[Api]:
    """A client of a fresh account, so tests never see each other's objects."""
    _, key = server.create_key(f"user{next(_accounts)}@example.com")
    client = Api(server, key)
    yield client
    client.http.close()


@pytest.fixture
def other_api(server: Server) -> Iterator[Api]:
    """A client of another fresh account."""
    _, key = server.create_key(f"other{next(_accounts)}@example.com")
    client = Api(server, key)
    yield client
    client.http.close()


@pytest.fixture(scope="session")
def neonctl_bin() -> Installation:
    """The pinned ``neonctl``, installed from npm once into ``.cache/neonctl`` and reused.

    A cold install takes about 10 s (8-11 s measured, npm cache or not); a reuse, ~50 ms.
    Imported here, not at the top, so suites that never run neonctl do not need Node.js.
    """
    from tests.neonctl import install

    return install()


@pytest.fixture
def neonctl(neonctl_bin: Installation, server: Server, api: Api, tmp_path: Path) -> Neonctl:
    """``neonctl`` run with the ``api`` fixture's key (a fresh account) against the server."""
    from tests.neonctl import Neonctl

    return Neonctl(neonctl_bin, api_host=server.base_url, api_key=api.key, workdir=tmp_path)
