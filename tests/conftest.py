"""Fixtures shared by every suite: one real server per session, accounts made with the CLI."""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

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


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    """The shared server; on a PostgreSQL store of this process's cluster with
    ``PGPLANE_TEST_STORE=postgresql`` (the suites that use it then run on that backend)."""
    store = None
    if os.environ.get("PGPLANE_TEST_STORE") == "postgresql":
        from tests.pgstore import store_cluster

        store = store_cluster().database()
    with running_server(store=store) as srv:
        yield srv
        assert_operations_settled(srv)


def _connect_store(srv: Server) -> contextlib.AbstractContextManager[Any]:
    """The server's store, as a DB-API connection, whichever backend it runs on."""
    url = srv.env.get("PGPLANE_STORE")
    if url:
        import psycopg

        return psycopg.connect(url, autocommit=True)
    return sqlite3.connect(srv.data_dir / "pgplane.db")


def assert_operations_settled(srv: Server, timeout: float = 120) -> None:
    """Every operation any test started has finished: none left behind, none failed.

    Read straight from the store, so operations no test polled are checked too.
    """
    deadline = time.monotonic() + timeout
    with _connect_store(srv) as db:
        while True:
            unsettled = db.execute(
                "SELECT project_id, action, status FROM operations"
                " WHERE status IN ('scheduling', 'running')"
            ).fetchall()
            if not unsettled or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        failed = db.execute(
            "SELECT project_id, action, error FROM operations WHERE status = 'failed'"
        ).fetchall()
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
