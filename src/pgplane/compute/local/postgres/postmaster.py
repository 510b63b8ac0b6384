"""The postmaster: spawn, readiness, stop.

Which process serves a data directory is what the platform recorded when it started it
(:mod:`.records`), checked against ``/proc`` (pids get reused); never what the tenant's
``postmaster.pid`` says. Postmasters run in their own session so they outlive pgplane; one
started by an earlier pgplane process is adopted through its record, one we spawned is also
reaped through its Popen.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from pgplane import failpoints
from pgplane.compute.driver import ComputeError, ComputeUsage
from pgplane.compute.local.postgres.pidfile import alive, processes_in
from pgplane.compute.local.postgres.readiness import (
    READY_TIMEOUT,
    log_size,
    stale_pid_file,
    wait_ready,
)
from pgplane.compute.local.postgres.records import (
    Records,
    Running,
    children_of,
    halted,
    is_alive,
    start_time,
)
from pgplane.compute.local.tenants.accounting import Ended, measure
from pgplane.compute.local.tenants.cgroups import Limits
from pgplane.compute.local.tenants.user import RunAs, postgres_env
from pgplane.compute.local.tenants.walls import Walls, cgroup_name

log = logging.getLogger(__name__)

_POLL = 0.001
# Fast shutdown (SIGINT) includes a checkpoint; give it time before the immediate one.
_STOP_STEPS = ((signal.SIGINT, 10.0), (signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0))
_HALTED_AFTER = 1.0  # seconds into a stop step before its processes are looked at for SIGSTOP


class _Child(subprocess.Popen[bytes]):
    def __del__(self) -> None:
        # Postmasters outlive the driver by design, so no "still running" ResourceWarning; the
        # stdlib's own list of running children still reaps it once it exits.
        if self.returncode is None and self.poll() is None:
            active = getattr(subprocess, "_active", None)
            if isinstance(active, list):
                active.append(self)


class Postmasters:
    """The postmasters of this driver, keyed by data directory, known by the platform's own
    records (:mod:`.records`), never by the tenant's ``postmaster.pid``."""

    def __init__(self, records: Path, walls: Walls | None = None) -> None:
        self._children: dict[Path, _Child] = {}
        self._records = Records(records)
        self.walls = walls or Walls.none()
        self.ended = Ended()  # endpoints' runs' last figures, read as they stopped

    def running(self, pgdata: Path) -> Running | None:
        """The live postmaster the platform started on ``pgdata``, or None."""
        self._reap(pgdata)
        record = self._records.get(pgdata)
        if record is None or not is_alive(record):
            return None
        return record

    def _reap(self, pgdata: Path) -> bool:
        """Collect our child's exit status if it has exited; True when it has."""
        child = self._children.get(pgdata)
        if child is None or child.poll() is None:
            return False
        del self._children[pgdata]
        return True

    async def start(
        self,
        argv: Sequence[str],
        *,
        pgdata: Path,
        port: int,
        socket_dir: Path,
        run_as: RunAs,
        log_path: Path,
        spawned: str | None = None,
        ready_timeout: float = READY_TIMEOUT,
        endpoint_id: str | None = None,
        readable: Sequence[Path] = (),
        limits: Limits | None = None,
        writable: Sequence[Path] = (),
    ) -> None:
        """Spawn the postmaster (walled), record it, and return once it says it serves and is in
        its cgroup.

        ``spawned``: the failpoint reached once the process exists, before it is ready.
        ``ready_timeout``: how long it may take (a recovery replays WAL first).
        ``endpoint_id``: the endpoint it serves (None for the platform's own postmasters).
        ``readable``: more than the data, socket and installation the sandbox lets it read.
        ``writable``: more than the data and socket directory it may write (another socket's).
        ``limits``: its cgroup's (an endpoint's size); None runs it in none (platform work).
        """
        env = postgres_env()
        stale_mtime, stale = await asyncio.to_thread(stale_pid_file, pgdata)
        if stale is not None:
            # A postmaster that died uncleanly left its pid file (a clean stop removes it): only
            # then can backends outlive it, so only then is /proc scanned (on the wake path).
            # As patroni does, tell Postgres the pid in it is safe to ignore rather than unlink
            # the file (unlink races): it may now belong to another process of the same user.
            env["PG_GRANDPARENT_PID"] = str(stale.pid)
            await self._end_leftovers(pgdata, run_as)
        cgroup = cgroup_name(pgdata) if limits is not None and self.walls.cgroups else None
        record = Running(
            leader=0,
            started=0,
            sandboxed=self.walls.sandboxed(run_as),
            port=port,
            socket_dir=socket_dir,
            argv=tuple(argv),
            endpoint_id=endpoint_id,
            cgroup=cgroup,
            cpu_range=None if limits is None else (limits.min_cpus, limits.max_cpus),
        )
        # Spawned first: its leader found, its record written and its cgroup made while it
        # starts up (each cost a wake its share, ~3 ms in all, when done before the spawn).
        log_from = await asyncio.to_thread(log_size, log_path)  # this start's words come after
        child = await asyncio.to_thread(
            self._spawn_walled, record, pgdata, run_as, log_path, env, readable, writable
        )
        self._children[pgdata] = child

        async def place() -> None:
            placed = await asyncio.to_thread(self._record, child, record, pgdata, limits)
            if spawned is not None:
                await failpoints.reached(spawned)
            if cgroup is not None and limits is not None:
                self.walls.watch(cgroup, limits)
                # Into its cgroup while it starts (each move may wait out an RCU grace
                # period), and there before its first client: start() returns after both.
                await self.walls.join(cgroup, placed.leader)

        try:
            placing = asyncio.ensure_future(place())
            try:
                await wait_ready(
                    pgdata,
                    socket_dir,
                    port,
                    alive=lambda: child.poll() is None,
                    log_path=log_path,
                    log_from=log_from,
                    status=child.poll,
                    time_limit=ready_timeout,
                    stale=stale_mtime,
                    confirm=False,  # its own pid file, newer than any a killed one left
                )
            finally:
                await placing
        except BaseException:
            # Leave nothing half started, whatever interrupted us (a timeout, a cancellation).
            await asyncio.shield(self._abort(pgdata, child))
            raise

    def _spawn_walled(
        self,
        record: Running,
        pgdata: Path,
        run_as: RunAs,
        log_path: Path,
        env: dict[str, str],
        readable: Sequence[Path],
        writable: Sequence[Path] = (),
    ) -> _Child:
        walled, switches = self.walls.wrap(
            record.argv,
            run_as=run_as,
            pgdata=pgdata,
            socket_dir=record.socket_dir,
            readable=readable,
            writable=writable,
        )
        return _spawn(walled, RunAs.current() if switches else run_as, log_path, env)

    def _record(
        self, child: _Child, record: Running, pgdata: Path, limits: Limits | None
    ) -> Running:
        """Its leader found and recorded, its cgroup made (empty: join fills it)."""
        try:
            leader = _sandbox_leader(child) if record.sandboxed else child.pid
            # started: 0 only if it exited at once; then nothing runs, and wait_ready says why.
            record = dataclasses.replace(record, leader=leader, started=start_time(leader) or 0)
            self._records.put(pgdata, record)
            if record.cgroup is not None and limits is not None and self.walls.cgroups:
                self.walls.cgroups.recreate(record.cgroup, limits)
        except BaseException:
            for pid in (*children_of(child.pid), child.pid):
                _signal(pid, signal.SIGKILL)
            child.wait(_STOP_STEPS[-1][1])
            raise
        return record

    async def _abort(self, pgdata: Path, child: _Child) -> None:
        if self.running(pgdata) is not None:
            await self.stop(pgdata)
        elif child.poll() is None:  # alive but not recorded yet
            for pid in (*children_of(child.pid), child.pid):  # a sandbox's pid 1 ends it all
                _signal(pid, signal.SIGKILL)
            await asyncio.to_thread(child.wait, _STOP_STEPS[-1][1])

    async def stop(self, pgdata: Path, *, signalled: str | None = None) -> bool:
        """Fast shutdown, escalating to immediate then kill; False when nothing was running.

        ``signalled``: the failpoint reached once the first signal is sent, before it is gone.
        """
        record = self.running(pgdata)
        if record is None:
            dead = self._records.get(pgdata)
            if dead is not None:  # it died on its own: what it left of its walls goes too
                await self._last_figures(pgdata, dead, None, counted=dead.cgroup is not None)
                if dead.cgroup is not None:
                    await self.walls.end_cgroup(dead.cgroup)
                await asyncio.to_thread(self._records.drop, pgdata)
            return False
        # Without a cgroup, what a run used is read from its processes: before they go.
        before = await self.usage(record)
        # A process of it stopped (SIGSTOP, by its tenant) acts on nothing but SIGKILL.
        stopped = await self.halted(record)
        if stopped:
            log.warning(
                "postmaster %d on %s: a process of it is stopped: killed", record.leader, pgdata
            )
        for sig, time_limit in _STOP_STEPS:
            if stopped and sig != signal.SIGKILL:
                continue
            postmaster = record.postmaster()
            if postmaster is not None:
                _signal(postmaster, sig)
            if signalled is not None and sig == _STOP_STEPS[0][0]:
                await failpoints.reached(signalled)
            if sig == signal.SIGKILL and record.sandboxed:
                _signal(record.leader, sig)  # pid 1 of the sandbox: the kernel ends the rest
            if await self._wait_gone(pgdata, record, time_limit):
                if sig == signal.SIGKILL and not record.sandboxed:  # its backends may run on
                    await self._end_leftovers(pgdata, None)
                await self._last_figures(pgdata, record, before, counted=True)
                if record.cgroup is not None:  # nothing of the tenant outlives its compute
                    await self.walls.end_cgroup(record.cgroup)
                await asyncio.to_thread(self._records.drop, pgdata)
                return True
            stopped = stopped or await self.halted(record)
            log.warning(
                "postmaster %d on %s still running after %s%s",
                record.leader,
                pgdata,
                sig.name,
                ": a process of it is stopped, so it is killed" if stopped else "",
            )
        raise ComputeError(f"postmaster {record.leader} on {pgdata} survived SIGKILL")

    async def _end_leftovers(self, pgdata: Path, run_as: RunAs | None) -> None:
        """SIGKILL what a dead postmaster left running in ``pgdata``; no postmaster serves it.

        A backend notices its postmaster died only when it waits (for its client, a lock): one
        busy in a query runs on, still attached to the old shared memory, and a new postmaster
        refuses to start beside it ("pre-existing shared memory block is still in use") until
        that query ends. Postgres itself ends every backend once one dies uncleanly; these are
        past saving too, and their open transactions are rolled back by the recovery.
        """
        uid = run_as.uid if run_as is not None else None
        leftovers = await asyncio.to_thread(processes_in, pgdata, uid)
        if not leftovers:
            return
        log.warning("ending processes %s left on %s by a dead postmaster", leftovers, pgdata)
        for pid in leftovers:
            _signal(pid, signal.SIGKILL)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _STOP_STEPS[-1][1]
        while any(alive(pid) for pid in leftovers):
            if loop.time() >= deadline:
                raise ComputeError(f"processes {leftovers} on {pgdata} survived SIGKILL")
            await asyncio.sleep(_POLL)

    async def _wait_gone(self, pgdata: Path, record: Running, time_limit: float) -> bool:
        """Whether it went within ``time_limit``; False as soon as one of its processes is
        found stopped (its tenant sent it SIGSTOP while it shut down): a gentler signal would
        wait out the whole step, with the operation's slot held, for a process that acts on
        nothing but SIGKILL. Looked for only once a normal shutdown would have ended, not on
        every poll of every stop."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + time_limit
        look_from = loop.time() + _HALTED_AFTER
        ours = pgdata in self._children and self._children[pgdata].pid == record.leader
        while True:
            if self._reap(pgdata) if ours else not is_alive(record):
                return True
            if loop.time() >= deadline:
                return False
            if loop.time() >= look_from and await self.halted(record):
                return False
            await asyncio.sleep(_POLL)

    async def halted(self, record: Running) -> bool:
        """Whether the postmaster, or any process of its compute, is stopped."""
        return await asyncio.to_thread(self._halted, record)

    def _halted(self, record: Running) -> bool:
        postmaster = record.postmaster()
        if postmaster is None:
            return False
        cgroups = self.walls.cgroups
        pids = {postmaster, *children_of(postmaster)}
        if cgroups is not None and record.cgroup is not None:
            pids |= cgroups.pids(record.cgroup)
        return any(halted(pid) for pid in pids)

    async def usage(self, record: Running) -> ComputeUsage | None:
        """What an endpoint's run used so far (None for the platform's own postmasters)."""
        if record.endpoint_id is None:
            return None
        return await asyncio.to_thread(measure, record, self.walls.cgroups)

    async def runs(self, pgdata: Path, endpoint_id: str) -> list[ComputeUsage]:
        """The endpoint's runs on ``pgdata`` with figures: lately ended ones, then its current."""
        runs = self.ended.of(pgdata, endpoint_id)
        current = self.running(pgdata)
        if current is not None and current.endpoint_id == endpoint_id:
            now = await self.usage(current)
            if now is not None:
                runs.append(now)
        return runs

    async def _last_figures(
        self, pgdata: Path, record: Running, before: ComputeUsage | None, *, counted: bool
    ) -> None:
        """Keep a stopped run's last figures: its cgroup's, read once its processes are gone
        (``counted``: the cgroup still holds them), or those read before it was stopped."""
        final = await self.usage(record) if counted and record.cgroup is not None else None
        if final is None or (before is not None and before.cpu_seconds > final.cpu_seconds):
            final = before
        if final is not None:
            self.ended.put(pgdata, record.endpoint_id, final)

    def watch_adopted(self, record: Running) -> None:
        """Autoscale a compute an earlier ``serve`` started (its range as recorded then)."""
        scaler, cgroups = self.walls.autoscaler, self.walls.cgroups
        if scaler is None or cgroups is None or record.cgroup is None or record.cpu_range is None:
            return
        if scaler.cpus(record.cgroup) is not None:
            return  # watched already
        low, high = record.cpu_range
        now = cgroups.quota_cpus(record.cgroup) or high
        scaler.watch(record.cgroup, Limits(now, 0, 0, min_cpus=low, max_cpus=high))

    async def resize(self, pgdata: Path, limits: Limits) -> None:
        """New limits for the running compute on ``pgdata`` (its autoscaling range changed)."""
        record = self.running(pgdata)
        if record is not None and record.cgroup is not None:
            await self.walls.resize(record.cgroup, limits)

    def forget(self) -> None:
        """Drop our children without stopping them (they outlive the driver)."""
        self._children.clear()
        self._records.forget()


def _sandbox_leader(child: _Child) -> int:
    """bwrap's pid 1 in the sandbox: the child bwrap forks first, within a few milliseconds.
    Polled in a thread, closely: the event loop's own timers would add their granularity to
    every wake."""
    deadline = time.monotonic() + READY_TIMEOUT
    while not (found := children_of(child.pid)):
        if child.poll() is not None or time.monotonic() >= deadline:
            return child.pid  # it exited: nothing runs, and wait_ready says why
        time.sleep(0.0002)
    return found[0]


def _spawn(argv: Sequence[str], run_as: RunAs, log_path: Path, env: dict[str, str]) -> _Child:
    # Root's, 0600, in a root's directory: its tenant writes to it only through the descriptor
    # its postmaster inherits (what the platform's sessions log stays the platform's to read).
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(log_path, flags, 0o600)  # root's: in a branch directory, root's
    os.fchmod(fd, 0o600)  # one an earlier version made
    with open(fd, "ab") as log_file:  # root's: the descriptor above
        return _Child(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            cwd="/",
            env=env,
            start_new_session=True,  # its own session: pgplane's exit or ^C must not reach it
            user=run_as.user,
            group=run_as.group,
            extra_groups=run_as.extra_groups,
        )


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
