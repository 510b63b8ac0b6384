"""One OS user per project: the wall between tenants that holds even against a superuser.

A tenant who becomes superuser on its compute (a Postgres CVE, a mistake) runs programs as the
OS user of its postmasters (``COPY ... FROM PROGRAM``). When pgplane runs as root, that user is
the project's own, owning only the project's data directories and sockets (0700), so it reaches
nothing of another project and nothing of the platform. The shared compute user (``pgplane``,
``--compute-user``) keeps only what holds no tenant data: the per-version templates and the
``postgres -C`` settings checks. As an ordinary user pgplane cannot switch users: everything
runs as itself, and isolation between projects needs root.

Names are derived from the project id, so a restart finds the same user without a record of
its own: ``pgp-<project id>``, or, when that passes Linux's 32 characters, ``pgp_`` and 28 hex
digits of the id's sha256. Ids are ``[a-z0-9-]``, so the two forms can never meet (an ``_``
never appears in the first). A user of that name must carry our mark (its comment names the
project) before it is used or removed: an administrator's own ``pgp-...`` account is refused,
never taken over.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import pwd
import shutil
import signal
import subprocess
import time
from collections import defaultdict
from pathlib import Path

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.tenants.user import RunAs, create_system_user, resolve_run_as

log = logging.getLogger(__name__)

PREFIX = "pgp-"
DIGEST_PREFIX = "pgp_"
MAX_NAME = 32  # useradd's limit (and utmp's) on Linux
_MARK = "pgplane project "
_TIMEOUT = 30.0
_USERDEL_NO_USER = 6
_KILL_ROUNDS = 20
# Directories every user may write to (sticky): where a tenant's leftovers may lie.
SHARED_PLACES = ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run/lock")  # noqa: S108


def project_user_name(project_id: str) -> str:
    """The OS user of ``project_id``'s computes (see the module docstring)."""
    name = PREFIX + project_id
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(project_id.encode()).hexdigest()
    return DIGEST_PREFIX + digest[: MAX_NAME - len(DIGEST_PREFIX)]


def _mark(project_id: str) -> str:
    return _MARK + project_id


class ComputeUsers:
    """Who runs what: the shared compute user, and each project's own (created on first use)."""

    def __init__(self, shared_name: str | None) -> None:
        self._shared_name = shared_name
        self._shared: RunAs | None = None
        self._projects: dict[str, RunAs] = {}
        self._locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    @property
    def per_project(self) -> bool:
        """Whether each project gets a user of its own (only root can switch users)."""
        return os.geteuid() == 0

    async def shared(self) -> RunAs:
        """The user of the templates and settings checks (ourselves when not root)."""
        if self._shared is None:
            async with self._locks[""]:
                if self._shared is None:
                    self._shared = await resolve_run_as(self._shared_name)
        return self._shared

    async def project(self, project_id: str) -> RunAs:
        """The user every process touching ``project_id``'s data runs as; created if missing."""
        found = self._projects.get(project_id)
        if found is not None:
            return found
        if not self.per_project:
            return await self.shared()
        async with self._locks[project_id]:
            if project_id not in self._projects:
                self._projects[project_id] = await _ensure_user(project_id)
        return self._projects[project_id]

    def find(self, project_id: str) -> RunAs | None:
        """The project's own user if it exists (never created here); None when not root."""
        if not self.per_project:
            return None
        found = self._projects.get(project_id)
        if found is not None:
            return found
        entry = _ours(project_user_name(project_id), project_id)
        if entry is None:
            return None
        return RunAs(name=entry.pw_name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)

    async def remove(self, project_id: str) -> None:
        """End every process of the project's user and delete the user; no-op when gone."""
        if not self.per_project:
            return
        async with self._locks[project_id]:
            self._projects.pop(project_id, None)
            await asyncio.to_thread(remove_project_user, project_id)


async def _ensure_user(project_id: str) -> RunAs:
    name = project_user_name(project_id)
    entry = _ours(name, project_id)
    if entry is None:
        await _create_user(name, project_id)
        entry = _ours(name, project_id)
        if entry is None:
            raise ComputeError(f"user {name!r} was not created")
    return RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True)


def _ours(name: str, project_id: str) -> pwd.struct_passwd | None:
    """The passwd entry of ``name`` if it is our user of ``project_id``; None if none exists."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    if entry.pw_gecos != _mark(project_id) or entry.pw_uid == 0:
        raise ComputeError(
            f"user {name!r} exists but is not pgplane's user of project {project_id}; "
            "rename or remove it"
        )
    return entry


async def _create_user(name: str, project_id: str) -> None:
    await create_system_user(name, "--home-dir", "/nonexistent", "--comment", _mark(project_id))
    log.info("created system user %r for the computes of project %s", name, project_id)


def remove_project_user(project_id: str) -> bool:
    """Delete the project's user (and its group) after ending its processes; False if none."""
    name = project_user_name(project_id)
    entry = _ours(name, project_id)
    if entry is None:
        return False
    end_processes(RunAs(name=name, uid=entry.pw_uid, gid=entry.pw_gid, switch=True))
    remove_files_of(entry.pw_uid)
    userdel = shutil.which("userdel")
    if userdel is None:
        raise ComputeError(f"cannot delete user {name!r}: userdel is not available")
    done = subprocess.run(
        [userdel, name], capture_output=True, text=True, timeout=_TIMEOUT, check=False
    )
    if done.returncode not in (0, _USERDEL_NO_USER):
        raise ComputeError(f"userdel {name} failed ({done.returncode}): {done.stderr.strip()}")
    log.info("deleted system user %r of project %s", name, project_id)
    return True


def remove_project_users(data_dir: Path) -> list[str]:
    """Delete the users of every project found under ``data_dir`` (hot or archived), as a
    data directory is thrown away whole (tests); the ids of those deleted."""
    if os.geteuid() != 0:
        return []
    found: set[str] = set()
    for folder in ("projects", "archive"):
        with contextlib.suppress(FileNotFoundError):
            found.update(e.name for e in (data_dir / folder).iterdir() if e.name[:1].isalnum())
    return [project_id for project_id in sorted(found) if remove_project_user(project_id)]


def remove_files_of(uid: int, places: tuple[str, ...] = SHARED_PLACES) -> list[str]:
    """Remove what a project's user left in the places every user may write to.

    A deleted user's uid goes to a later project: whatever the old tenant left in /tmp or
    /dev/shm would become the new one's. Only entries of ``uid`` at the top of each place are
    removed (a user can write nowhere deeper but in its own), without following links.
    """
    removed = []
    for place in places:
        # A place that is missing, or an entry gone between the listing and its stat, ends this
        # place's listing: none of its entries is taken from the place before.
        entries: list[os.DirEntry[str]] = []
        with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(place) as it:
            entries = [e for e in it if e.stat(follow_symlinks=False).st_uid == uid]
        for entry in entries:
            with contextlib.suppress(FileNotFoundError):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)  # fd-based on Linux: safe against link swaps
                else:
                    os.unlink(entry.path)
                removed.append(entry.path)
    if removed:
        log.info("removed %d files of uid %d from shared places: %s", len(removed), uid, removed)
    return removed


def end_processes(run_as: RunAs) -> list[int]:
    """SIGKILL every process of a project's own user: what a tenant may have left running.

    A superuser tenant can start programs that outlive its postmaster. Before root works on the
    project's files (archive, removal) nothing of the tenant may run to change them under it.
    The kill is sent as the user itself (``kill(-1)``), which reaches all of its processes and
    none of anyone else's, and repeated until none is left (one may fork meanwhile).
    """
    if not run_as.switch or run_as.uid == 0:
        raise ComputeError("refusing to end the processes of a user that is not a project's")
    found: set[int] = set()
    for _ in range(_KILL_ROUNDS):
        left = processes_of(run_as.uid)
        if not left:
            return sorted(found)
        found.update(left)
        # The shell's own kill: any interpreter of ours may sit where the user cannot reach.
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["/bin/sh", "-c", "kill -9 -1"],
                user=run_as.uid,
                group=run_as.gid,
                extra_groups=[],
                cwd="/",
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_TIMEOUT,
                check=False,
            )
        for pid in left:  # kill(-1) spares the caller only; these are not it
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _wait_dead(left)
    left = processes_of(run_as.uid)
    if left:
        raise ComputeError(f"processes {left} of user {run_as.name!r} survived SIGKILL")
    return sorted(found)


def _wait_dead(pids: list[int], time_limit: float = 2.0) -> None:
    """A SIGKILLed process takes a moment to die: wait, so one is not counted twice."""
    deadline = time.monotonic() + time_limit
    while time.monotonic() < deadline:
        if not any(_running(pid) for pid in pids):
            return
        time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]  # root's
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def processes_of(uid: int) -> list[int]:
    """Live (not zombie) processes whose effective user is ``uid``, from /proc."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if proc.stat().st_uid != uid:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]  # root's
        except (OSError, IndexError):
            continue  # exited meanwhile
        if state not in ("Z", "X"):
            found.append(int(proc.name))
    return found
