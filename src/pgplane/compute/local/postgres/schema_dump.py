"""A database's schema as ``pg_dump --schema-only`` prints it (Neon's ``GET …/schema``).

The hazards, and what meets each:

- **The server is the tenant's.** A tenant may hold its compute's OS user, so whatever answers
  on the socket may be a program of its own, sending anything. ``pg_dump`` therefore runs as
  the project's OS user (never root, never the shared user that owns the installations), and
  where computes are sandboxed in a sandbox of its own that sees its installation and the
  socket directory alone: at worst a hostile server takes over a process that was already its
  own, walled as its compute is. libpq's ``requirepeer`` (sessions.conninfo) speaks only to a
  server running as the socket directory's owner, so a link to another project's socket leads
  nowhere.
- **Its output is unbounded and may never end.** Read from a pipe up to ``max_bytes``, with
  the process killed past that or past its time limit; off the event loop (a thread of the
  tenants' own pool, :mod:`pgplane.compute.local.tenants.waits`: uvloop cannot start a child
  as another user). ``--lock-wait-timeout`` keeps a tenant's lock on a table from holding the
  dump for the whole limit.
- **Names are the tenant's.** The database name travels inside a conninfo string built by
  libpq's own quoting, so a database named ``host=/elsewhere`` stays a name. Every other name
  or comment is quoted by pg_dump as SQL; the answer is JSON, so nothing in it is interpreted.
- **Platform roles.** The dump runs as ``cloud_admin`` (a superuser sees every object, its
  owner and grants); statements that only concern the platform's roles (``GRANT … TO
  cloud_admin``, ``ALTER … OWNER TO pgplane_monitor``) are left out of the answer.
- **psql meta-commands.** pg_dump (since 17.6, 16.10, 15.14, 14.19, 13.22) brackets its output
  with ``\\restrict KEY``, so that psql replaying it refuses meta-commands a hostile server
  smuggled in. Its random key would make two dumps of the same schema differ, and a schema diff
  never empty: the key we give it is replaced by one derived from the dump's own content (a
  server cannot write the key of a text that contains it), stable for the same schema.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import subprocess
import threading
from pathlib import Path
from typing import IO

from pgplane.compute.driver import ComputeError, DatabaseNotFound, SchemaTooLarge
from pgplane.compute.local.postgres.binaries import PgInstall
from pgplane.compute.local.postgres.sessions import ADMIN_USER, PLATFORM_ROLES, conninfo
from pgplane.compute.local.tenants.user import C_LOCALE, RunAs, postgres_env
from pgplane.compute.local.tenants.waits import wait_on
from pgplane.compute.local.tenants.walls import Walls

DUMP_TIMEOUT = 60.0  # seconds for the whole dump
LOCK_WAIT = "10s"  # for each table's ACCESS SHARE lock: a tenant's open ALTER TABLE, say
_CHUNK = 1 << 16
_STDERR_KEPT = 4096
# The first minor of each major whose pg_dump writes \restrict (the fix of CVE-2025-8714).
_RESTRICT_SINCE = {13: 22, 14: 19, 15: 14, 16: 10, 17: 6}
_MISSING_DATABASE = re.compile(r'database "(?:[^"]|"")*" does not exist')
# The statements of pg_dump that name a role as grantee, grantor or owner, one line each.
_ROLE_STATEMENT = re.compile(r"^(GRANT|REVOKE|ALTER .* OWNER TO|ALTER DEFAULT PRIVILEGES) ")


class SchemaDump:
    """The action that dumps ``dbname`` on whichever postmaster serves the branch
    (``Computes.on_branch``); ``sql`` holds the text once it ran."""

    def __init__(
        self, install: PgInstall, run_as: RunAs, dbname: str, max_bytes: int, walls: Walls
    ) -> None:
        self._install, self._run_as, self._dbname = install, run_as, dbname
        self._max_bytes = max_bytes
        self._walls = walls
        self.sql = ""

    async def __call__(self, socket_dir: Path, port: int) -> None:
        self.sql = await dump_schema(
            self._install,
            self._run_as,
            socket_dir,
            port,
            self._dbname,
            max_bytes=self._max_bytes,
            walls=self._walls,
        )


async def dump_schema(
    install: PgInstall,
    run_as: RunAs,
    socket_dir: Path,
    port: int,
    dbname: str,
    *,
    max_bytes: int,
    walls: Walls | None = None,
    time_limit: float = DUMP_TIMEOUT,
) -> str:
    """The schema of ``dbname`` on the postmaster at ``socket_dir``/``port``, as SQL text."""
    key = secrets.token_hex(16) if _writes_restrict(install) else None
    argv = [
        os.fspath(install.bin_dir / "pg_dump"),
        "--schema-only",
        "--no-password",
        f"--lock-wait-timeout={LOCK_WAIT}",
        *([f"--restrict-key={key}"] if key else []),
        "--dbname",
        conninfo(socket_dir, port, user=ADMIN_USER, dbname=dbname),
    ]
    # In a sandbox of its own where computes have one (it switches user itself then).
    walled, switches = (
        walls.wrap_client(argv, run_as=run_as, socket_dir=socket_dir)
        if walls is not None
        else (argv, False)
    )
    # Filtering a big dump is CPU work too: off the loop with the dump, in the tenants' pool.
    who = RunAs.current() if switches else run_as
    return await wait_on(run_as, _dump, walled, who, max_bytes, time_limit, key)


def _dump(
    argv: list[str], run_as: RunAs, max_bytes: int, time_limit: float, key: str | None
) -> str:
    return _stable_key(_without_platform_roles(_run(argv, run_as, max_bytes, time_limit)), key)


def _writes_restrict(install: PgInstall) -> bool:
    parts = install.version.split(".")
    minor = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    since = _RESTRICT_SINCE.get(install.major)
    return install.major >= 18 or (since is not None and minor >= since)


def _run(argv: list[str], run_as: RunAs, max_bytes: int, time_limit: float) -> str:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd="/",
        env={**postgres_env(), **C_LOCALE},
        user=run_as.user,
        group=run_as.group,
        extra_groups=run_as.extra_groups,
    )
    stdout, stderr = _pipe(proc.stdout), _pipe(proc.stderr)
    timer = threading.Timer(time_limit, proc.kill)
    errors: list[bytes] = []
    drain = threading.Thread(target=_drain, args=(stderr, errors), daemon=True)
    timer.start()
    drain.start()
    out = bytearray()
    try:
        while chunk := os.read(stdout.fileno(), _CHUNK):
            out += chunk
            if len(out) > max_bytes:
                proc.kill()
                raise SchemaTooLarge(
                    f"the schema is larger than {max_bytes} bytes, the most this platform returns"
                )
        code = proc.wait()
    finally:
        timer.cancel()
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        drain.join(timeout=5)
        stdout.close()
    if code != 0:
        said = b"".join(errors).decode(errors="replace").strip()
        if code < 0 and not timer.is_alive() and not said:
            raise ComputeError(f"pg_dump did not finish in {time_limit:.0f} s")
        missing = _MISSING_DATABASE.search(said)
        if missing:
            raise DatabaseNotFound(missing.group(0))
        raise ComputeError(f"pg_dump failed ({code}): {said[-1000:]}")
    return out.decode("utf-8", errors="replace")


def _pipe(stream: IO[bytes] | None) -> IO[bytes]:
    if stream is None:  # not with stdout and stderr=PIPE: for the type checker
        raise ComputeError("pg_dump started without its pipes")
    return stream


def _drain(stream: IO[bytes], kept: list[bytes]) -> None:
    """Read ``stream`` to its end (a full pipe would stall pg_dump), keeping the first bytes."""
    size = 0
    with stream:
        while chunk := os.read(stream.fileno(), _CHUNK):
            if size < _STDERR_KEPT:
                kept.append(chunk[: _STDERR_KEPT - size])
                size += len(kept[-1])


def _without_platform_roles(text: str) -> str:
    """The dump without the statements that grant to, revoke from or give to a platform role.

    Split into statements as Postgres would (a tenant's comment or function body may hold a
    line that reads like one); decided on the statement with every quoted part masked."""
    kept: list[str] = []
    for statement, masked in _statements(text):
        if _ROLE_STATEMENT.match(masked.lstrip()) and _PLATFORM_GRANTEE.search(masked):
            continue
        kept.append(statement)
    return "".join(kept)


_PLATFORM_GRANTEE = re.compile(
    rf"\b(?:TO|FROM|ROLE|BY)\s+(?:{'|'.join(sorted(PLATFORM_ROLES))})\b(?!\.)"
)
# What opens a quoted part, a comment, or ends a statement (a psql meta-command line too).
_OPENER = re.compile(r"""[Ee]'|'|"|\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$|--|/\*|;|^\\""", re.M)


def _statements(text: str) -> list[tuple[str, str]]:
    """``text`` cut after each top-level ``;`` (or meta-command line): each piece with its quoted
    parts and comments masked (see _mask)."""
    pieces: list[tuple[str, str]] = []
    masked: list[str] = []
    start = pos = 0
    while (found := _OPENER.search(text, pos)) is not None:
        opener = found.group(0)
        masked.append(text[pos : found.start()])
        end = _closing(text, found.end(), opener)
        if opener == ";" or opener.startswith("\\"):
            end = text.find("\n", found.end()) + 1 or len(text)
            masked.append(text[found.start() : end])
            pieces.append((text[start:end], "".join(masked)))
            masked, start = [], end
        else:
            masked.append(_mask(text[found.start() : end], opener))
        pos = end
    if start < len(text):
        pieces.append((text[start:], "".join(masked) + text[pos:]))
    return pieces


def _mask(part: str, opener: str) -> str:
    """A comment becomes blanks (a statement after one still starts the piece), a quoted part
    its opening character and ``x``s (a name or literal still stands where it was)."""
    if opener in ("--", "/*"):
        return " " * len(part)
    return part[0] + "x" * (len(part) - 1)


_QUOTED_END = {
    "'": re.compile(r"(?:[^']|'')*'"),
    "E'": re.compile(r"(?:[^'\\]|\\.|'')*'", re.S),
    '"': re.compile(r'(?:[^"]|"")*"'),
}
_COMMENT_MARK = re.compile(r"/\*|\*/")


def _closing(text: str, after: int, opener: str) -> int:
    """Where the quoted part or comment ``opener`` began ends (the text's end if never)."""
    quoted = _QUOTED_END.get("E'" if opener == "e'" else opener)
    if quoted is not None:
        found = quoted.match(text, after)
        return found.end() if found else len(text)
    if opener.startswith("$"):
        end = text.find(opener, after)
        return end + len(opener) if end >= 0 else len(text)
    if opener == "--":
        end = text.find("\n", after)
        return end if end >= 0 else len(text)
    if opener == "/*":
        depth, pos = 1, after
        while depth and (found := _COMMENT_MARK.search(text, pos)) is not None:
            depth += 1 if found.group(0) == "/*" else -1
            pos = found.end()
        return pos if not depth else len(text)
    return after


def _stable_key(text: str, key: str | None) -> str:
    """Replace pg_dump's ``\\restrict`` key with one derived from the rest of the dump."""
    if key is None or key not in text:
        return text
    derived = hashlib.sha256(text.replace(key, "").encode()).hexdigest()[:32]
    return text.replace(key, derived)
