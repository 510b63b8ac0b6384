"""One database's schema replayed with ``psql``, as a role of the tenant's, never a superuser.

The SQL is ``pg_dump``'s, but of a server the tenant may hold: whatever it says runs with the
privileges of the role ``psql`` logs in as, which holds exactly its project's roles (see
``target``). Functions a restore can run (a partition key's or a generated column's immutable
call, folded as it is created) run as that role, with nothing a tenant's own session lacks.

``psql`` runs as the project's OS user, in a sandbox of its own where computes have one (seeing
its installation and the new cluster's socket directory alone), with a time limit; it stops at
the first error, and Postgres' words for it name what could not be restored. ``\\restrict``,
with which ``pg_dump`` brackets its output, keeps meta-commands out of the replay.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path

from pgplane.compute.driver import ComputeError, RestoreFailed
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.sessions import conninfo
from pgplane.compute.local.tenants.user import C_LOCALE, RunAs, postgres_env
from pgplane.compute.local.tenants.waits import wait_on
from pgplane.compute.local.tenants.walls import Walls

RESTORE_TIMEOUT = 600.0  # seconds for one database's schema
_STDERR_KEPT = 8192
_CHUNK = 1 << 16


async def replay(
    install: PgInstall,
    run_as: RunAs,
    walls: Walls,
    socket_dir: Path,
    port: int,
    *,
    user: str,
    dbname: str,
    sql: str,
    time_limit: float = RESTORE_TIMEOUT,
) -> None:
    """Run ``sql`` in ``dbname`` as ``user``; RestoreFailed with Postgres' error if it fails."""
    argv = [
        os.fspath(install.bin_dir / "psql"),
        "--no-psqlrc",
        "--quiet",
        "--no-password",
        "--set=ON_ERROR_STOP=1",
        "--dbname",
        conninfo(socket_dir, port, user=user, dbname=dbname, statement_timeout=time_limit),
    ]
    walled, switches = walls.wrap_client(argv, run_as=run_as, socket_dir=socket_dir)
    who = RunAs.current() if switches else run_as
    await wait_on(run_as, _run, walled, who, sql.encode(), time_limit, dbname)


def _run(argv: list[str], run_as: RunAs, sql: bytes, time_limit: float, dbname: str) -> None:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,  # query results (pg_dump's set_config): not wanted
        stderr=subprocess.PIPE,
        cwd="/",
        env={**postgres_env(), **C_LOCALE},
        user=run_as.user,
        group=run_as.group,
        extra_groups=run_as.extra_groups,
    )
    timer = threading.Timer(time_limit, proc.kill)
    said: list[bytes] = []
    drain = threading.Thread(target=_drain, args=(proc, said), daemon=True)
    timer.start()
    drain.start()
    try:
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError), proc.stdin:
                proc.stdin.write(sql)  # psql stopped at an error: the rest is not wanted
        code = proc.wait()
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        drain.join(timeout=5)
    if code == 0:
        return
    text = b"".join(said).decode(errors="replace")
    if code < 0 and not timer.is_alive() and not text.strip():
        raise RestoreFailed(
            f"restoring the schema of database {dbname!r} took longer than {time_limit:.0f} s"
        )
    refused = [line for line in text.splitlines() if "ERROR:" in line]
    if refused:  # Postgres refused a statement of the schema: the same schema always will
        reason = refused[0].replace("psql:<stdin>:", "line ")
        raise RestoreFailed(f"restoring the schema of database {dbname!r} failed: {reason[:1000]}")
    # Anything else (no connection, psql killed) may pass: the operation tries again.
    raise ComputeError(
        f"replaying the schema of database {dbname!r}: psql exited {code}: {text.strip()[-1000:]}"
    )


def _drain(proc: subprocess.Popen[bytes], kept: list[bytes]) -> None:
    """Read psql's messages to their end (a full pipe would stall it), keeping the first."""
    stream = proc.stderr
    if stream is None:
        return
    size = 0
    with stream:
        while chunk := os.read(stream.fileno(), _CHUNK):
            if size < _STDERR_KEPT:
                kept.append(chunk[: _STDERR_KEPT - size])
                size += len(kept[-1])
