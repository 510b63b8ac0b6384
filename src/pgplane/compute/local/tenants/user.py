"""Who Postgres runs as: the current user, or an unprivileged system user when we are root.

Postgres refuses to run as root. Rather than su/sudo (a PAM stack, a login shell, an environment
to scrub), the kernel does the switch: subprocess's ``user``/``group``/``extra_groups`` make the
child drop to the compute user between fork and exec.
"""

from __future__ import annotations

import asyncio
import grp
import logging
import os
import pwd
import shutil
import stat
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.driver import ComputeError

log = logging.getLogger(__name__)

DEFAULT_COMPUTE_USER = "pgplane"
_USERADD_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class RunAs:
    """The identity of every Postgres process; ``switch`` is False when we already are it."""

    name: str
    uid: int
    gid: int
    switch: bool

    @property
    def user(self) -> int | None:
        return self.uid if self.switch else None

    @property
    def group(self) -> int | None:
        return self.gid if self.switch else None

    @property
    def extra_groups(self) -> list[int] | None:
        # Without this the child would keep root's supplementary groups.
        return [] if self.switch else None

    def chown(self, path: Path) -> None:
        if self.switch:
            os.chown(path, self.uid, self.gid, follow_symlinks=False)

    def may_traverse(self, directory: Path) -> bool:
        """Whether the mode bits let this user search ``directory`` (ACLs are not considered)."""
        st = directory.stat()
        if st.st_uid == self.uid:
            return bool(st.st_mode & stat.S_IXUSR)
        if st.st_gid == self.gid:
            return bool(st.st_mode & stat.S_IXGRP)
        return bool(st.st_mode & stat.S_IXOTH)

    @classmethod
    def current(cls) -> RunAs:
        """Ourselves: for commands that need no change of user (cp, ldd, useradd)."""
        return cls(name=str(os.geteuid()), uid=os.geteuid(), gid=os.getegid(), switch=False)

    async def run(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        time_limit: float,
        check: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> str:
        """Run a command as this user; return its stdout, raise ComputeError with its stderr.

        The command is killed if it outlives ``time_limit``; ``env`` adds to its environment.
        """
        done = await self.completed(argv, time_limit=time_limit, env=env)
        if check and done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip()[-2000:]
            raise ComputeError(f"{os.fspath(argv[0])} failed ({done.returncode}): {tail}")
        return done.stdout.decode(errors="replace")

    async def completed(
        self,
        argv: Sequence[str | os.PathLike[str]],
        *,
        time_limit: float,
        env: Mapping[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a command as this user to its end, whatever its exit status (as :meth:`run`)."""
        # A thread running subprocess.run rather than asyncio's subprocesses: uvloop (the
        # server's loop) does not support user/group for its child processes.
        try:
            return await asyncio.to_thread(
                subprocess.run,
                [os.fspath(a) for a in argv],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                cwd="/",  # our own cwd may be unreachable for the compute user (e.g. under /root)
                env={**postgres_env(), **(env or {})},
                user=self.user,
                group=self.group,
                extra_groups=self.extra_groups,
                timeout=time_limit,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise ComputeError(f"{os.fspath(argv[0])} timed out after {time_limit:.0f} s") from None


# For a tool whose output we parse (pg_controldata, postgres -C): English, whatever the machine's.
C_LOCALE = {"LC_ALL": "C", "LANG": "C", "LANGUAGE": ""}


# What of the platform's environment a tenant's process may see: how to find programs and
# libraries, and the locale and time zone. Nothing else: the platform's own settings hold its
# secrets (the object store's credentials, a PostgreSQL store's URL), and libpq's variables
# (PGDATA, PGPORT, ...) would steer the tools.
_PASSED = frozenset({"PATH", "LD_LIBRARY_PATH", "LANG", "LANGUAGE", "TZ", "TZDIR"})


def postgres_env() -> dict[str, str]:
    """The environment of a Postgres program the platform runs (a compute's included)."""
    return {k: v for k, v in os.environ.items() if k in _PASSED or k.startswith("LC_")}


async def resolve_run_as(compute_user: str | None) -> RunAs:
    """The current user when not root; otherwise the compute user, created if missing."""
    euid = os.geteuid()
    if euid != 0:
        name = pwd.getpwuid(euid).pw_name if _has_passwd_entry(euid) else str(euid)
        return RunAs(name=name, uid=euid, gid=os.getegid(), switch=False)
    name = compute_user or DEFAULT_COMPUTE_USER
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        await create_system_user(name)
        log.info("created system user %r to run Postgres computes", name)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise ComputeError(f"compute user {name!r} is root; Postgres refuses to run as root")
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)


def _has_passwd_entry(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True


async def create_system_user(name: str, *extra: str) -> None:
    """``useradd`` a system user: no login shell, no home, a group of its own (or the group of
    its name, left by an earlier user); ``extra`` are more useradd options."""
    useradd = shutil.which("useradd")
    if useradd is None:
        raise ComputeError(f"user {name!r} does not exist and useradd is not available")
    nologin = shutil.which("nologin") or "/usr/sbin/nologin"
    try:
        grp.getgrnam(name)
    except KeyError:
        group_args = ["--user-group"]
    else:
        # A group of that name exists already: --user-group would fail, so join it instead.
        group_args = ["--gid", name]
    argv = [useradd, "--system", "--no-create-home", "--shell", nologin, *group_args, *extra]
    await RunAs.current().run([*argv, name], time_limit=_USERADD_TIMEOUT)


def open_traversal(path: Path, run_as: RunAs) -> list[Path]:
    """Let ``run_as`` reach ``path``: add only the search bit on ancestors that lack it.

    Returns the directories changed (and logs them), so an operator who put the data directory
    under /root learns exactly what was loosened: search (x), never listing (r).
    """
    if not run_as.switch:
        return []
    changed: list[Path] = []
    for directory in [*reversed(path.parents), path]:
        if run_as.may_traverse(directory):
            continue
        st = directory.stat()
        if st.st_uid == run_as.uid:
            bit = stat.S_IXUSR
        elif st.st_gid == run_as.gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        directory.chmod(stat.S_IMODE(st.st_mode) | bit)
        changed.append(directory)
    if changed:
        log.warning(
            "added the search (x) permission for compute user %r on %s so it can reach %s",
            run_as.name,
            ", ".join(str(d) for d in changed),
            path,
        )
    return changed
