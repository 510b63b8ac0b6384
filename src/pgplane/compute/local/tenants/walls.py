"""What walls a compute: its sandbox and its cgroup, as far as this machine allows.

Found once, at the driver's start, and said in the log: as root with namespaces and cgroups,
every postmaster on a tenant's data runs sandboxed (:mod:`.sandbox`) and every endpoint's in a
cgroup of its size (:mod:`.cgroups`); as an ordinary user, or where the kernel refuses, the log
says plainly which wall is missing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pgplane.compute.local.tenants.autoscale import Autoscaler
from pgplane.compute.local.tenants.cgroups import Cgroups, Limits
from pgplane.compute.local.tenants.sandbox import Sandbox
from pgplane.compute.local.tenants.user import RunAs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Walls:
    sandbox: Sandbox | None
    cgroups: Cgroups | None
    readable: tuple[Path, ...]  # what every sandbox sees read-only (the platform's pg_hba.conf)
    autoscaler: Autoscaler | None = None

    @classmethod
    def none(cls) -> Walls:
        return cls(sandbox=None, cgroups=None, readable=())

    @classmethod
    def find(cls, etc_dir: Path, readable: Sequence[Path], *, enabled: bool = True) -> Walls:
        """This machine's walls; what is missing is logged as a warning."""
        if not enabled:
            log.warning("computes are not sandboxed and have no cgroups: turned off")
            return cls.none()
        sandbox, said = Sandbox.find(etc_dir)
        if sandbox is None:
            log.warning(
                "computes are not sandboxed (%s): a tenant holding its compute's OS user "
                "sees the machine's processes and reaches loopback ports",
                said,
            )
        else:
            log.info("computes run sandboxed: %s", said)
        cgroups, said = Cgroups.find()
        if cgroups is None:
            log.warning(
                "computes have no cgroups (%s): nothing caps a tenant's CPU, memory or processes",
                said,
            )
        else:
            log.info("computes run in cgroups: %s", said)
        autoscaler = Autoscaler(cgroups) if cgroups is not None else None
        return cls(sandbox, cgroups, tuple(readable), autoscaler)

    def wrap(
        self,
        argv: Sequence[str],
        *,
        run_as: RunAs,
        pgdata: Path,
        socket_dir: Path,
        readable: Sequence[Path],
        writable: Sequence[Path] = (),
    ) -> tuple[list[str], bool]:
        """The command line that runs ``argv`` walled, and whether it switches user itself.

        The sandbox sees the directory holding the data directory (the branch's: its WAL
        archive sits beside the data, and hard links do not cross mounts), the socket
        directory, the installation ``argv[0]`` belongs to and ``readable``; it may write the
        first two and ``writable``.
        """
        wrapped = list(argv)
        switches = False
        if self.sandbox is not None and run_as.switch:
            wrapped = self.sandbox.wrap(
                argv,
                run_as=run_as,
                readable=[*_installation(Path(argv[0])), *self.readable, *readable],
                writable=[pgdata.parent, socket_dir, *writable],
            )
            switches = True
        return wrapped, switches

    def wrap_client(
        self, argv: Sequence[str], *, run_as: RunAs, socket_dir: Path
    ) -> tuple[list[str], bool]:
        """A Postgres client program (``pg_dump``) run walled as ``run_as``, as its postmaster
        is: it sees its installation and the postmaster's socket directory, nothing else. A
        hostile server that took it over holds no more than the tenant's own sandbox."""
        if self.sandbox is None or not run_as.switch:
            return list(argv), False
        readable = _installation(Path(argv[0]))
        return self.sandbox.wrap(
            argv, run_as=run_as, readable=readable, writable=[socket_dir]
        ), True

    def sandboxed(self, run_as: RunAs) -> bool:
        return self.sandbox is not None and run_as.switch

    def watch(self, name: str, limits: Limits) -> None:
        """Autoscale the compute's CPU within its range (its cgroup made)."""
        if self.autoscaler is not None:
            self.autoscaler.watch(name, limits)

    async def join(self, name: str, root: int) -> None:
        """Move ``root`` and everything it forked into the compute's cgroup.

        Off the wake's path, while Postgres starts: on cgroup v1 each move waits for an RCU
        grace period once the kernel has been quiet (10-30 ms here), which a join before the
        start would add to every wake. Moved in passes until one finds nothing outside (a
        process forked by one not yet moved is caught by the next); forks after that inherit
        the cgroup. Until then the compute runs uncapped for those milliseconds, before it
        has taken a login; nothing of it outlives it regardless (its PID namespace).
        """
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.join_tree, name, root)

    async def resize(self, name: str, limits: Limits) -> None:
        """New limits for a running compute (its range changed, its command line did not)."""
        if self.cgroups is not None:
            now = self.autoscaler.cpus(name) if self.autoscaler is not None else None
            if now is not None and limits.min_cpus <= now <= limits.max_cpus:
                limits = dataclasses.replace(limits, cpus=now)  # where autoscaling had it
            await asyncio.to_thread(self.cgroups.set_limits, name, limits)
            if self.autoscaler is not None:
                self.autoscaler.watch(name, limits)

    async def end_cgroup(self, name: str) -> None:
        """Kill what is left in the cgroup and remove it."""
        if self.cgroups is not None:
            if self.autoscaler is not None:
                self.autoscaler.forget(name)
            await asyncio.to_thread(self.cgroups.kill, name)


def _installation(postgres: Path) -> list[Path]:
    """The installation a ``bin/postgres`` belongs to, and the libraries a wheel keeps beside
    its package (auditwheel's ``<package>.libs``: the wheel's psql and libpq for dblink)."""
    install = postgres.resolve().parent.parent
    libs = install.parent.parent / f"{install.parent.name}.libs"
    return [install, libs] if libs.is_dir() else [install]


def cgroup_name(pgdata: Path) -> str:
    return "pg-" + hashlib.sha256(os.fsencode(pgdata)).hexdigest()[:24]
