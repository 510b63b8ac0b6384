"""Failpoints: named places where a test can stop or slow the platform, to act exactly there.

Crash tests need "killed after the side effect, before it was recorded" to be a place, not a
chance timing; concurrency tests need "while this operation is still running" to last long
enough for the requests they send meanwhile. As in Neon (which uses the ``fail`` crate's
syntax), the code names such places and ``PGPLANE_FAILPOINTS``, read once at start-up, arms some
of them: comma-separated ``name`` or ``name=action``, where the action is

- ``wait`` (the default, so a bare name): log that it was reached, then wait forever, holding
  whatever the code holds there, until the process is killed;
- ``sleep(MS)``: log, pause MS milliseconds (without blocking the event loop), and go on;
- ``raise``: log and raise :class:`FailpointError`, a poison step (an operation that can never
  succeed must still end, ``failed`` with its reason, and hold nothing up meanwhile);

optionally prefixed by ``N*`` to act only the first N times the place is reached in this
process, and be off afterwards (``create_branch:copied=1*sleep(3000)``: the first branch copy
pauses for 3 s, later ones do not). Unarmed, reaching one costs a dictionary lookup. A spec that
does not parse stops the process at start-up, rather than running a test without its failpoint.

Names: ``before:<action>`` and ``after:<action>`` around every operation handler (after: its
work is done, the store does not know yet), and inside the handlers, named after the step:
``create_timeline:copied|populated|synced`` (the template copied; the cluster being built is
running with its roles; flushed, not yet in place), ``start_compute:spawned`` (a postmaster
exists, not yet ready), ``stop_compute:signalled`` (told to stop, maybe not gone),
``restart_compute:signalled`` (an endpoint's new settings: the old postmaster told to stop),
``offline_postmaster:ready`` (a temporary postmaster on a branch with no compute running, for a
check or a change), ``suspend_compute:roles_read``, ``apply_config:executed`` (after each
statement of a change), ``create_branch:backup_started`` (an online copy inside the parent's
backup), ``create_branch:copied`` (the copy is durable, not yet in place; both also inside a
read-only compute's start, which copies its branch), ``start_replica:copied`` (a read-only
compute's copy in place, its standby not yet started), ``expire_branch:due`` (the scheduler
found an expired branch, its deletion not yet recorded), ``delete_timeline:stopped`` and
``delete_tenant:stopped`` (computes stopped, files still there), ``tenant_detach:packed`` (the
archive is verified, the hot copy still there), ``tenant_detach:stored`` (with shared storage:
the archive stored and verified there, the hot copy and the local archive still here),
``tenant_reattach:fetched`` (an archive another node stored, fetched and checked, not yet
unpacked), ``tenant_reattach:unpacked`` (the data is back in place, the archive not yet
removed), ``rebuild:replaying`` (a copy of a base state being replayed to a point of history by
a temporary postmaster), ``restore_branch:built`` (a restore's new data complete beside the
branch's), ``restore_branch:moved`` (the branch's old data moved out of its place, the new data
not yet in), ``project_volume:mounted`` (a new project's filesystem mounted, its directory not
yet given to its user), ``point_read:serving`` (a schema read at a point of history: the point
rebuilt, its temporary postmaster serving), ``schema_only:read`` (a schema-only branch's source
read, nothing of it built yet) and ``schema_only:restored`` (its new cluster holds the schema,
its temporary postmaster still running, the data not yet in place),
``anonymize:database_masked`` (an anonymized branch's masks committed in one of its databases,
the masking's end not yet recorded), ``ship:wal_stored`` and ``ship:base_stored`` (with shared
or object storage: a branch's WAL file or base state stored there, its ``head.json`` not yet
naming it; reached in the shipping round's thread), ``recover:store_fetched`` and
``recover:project_rebuilt`` (``pgplane recover``: the store in place, nothing brought back yet;
a project's branches rebuilt, the next not yet). The crash suites kill the server at each."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

ENV = "PGPLANE_FAILPOINTS"

_ACTION = re.compile(
    r"^(?:(?P<times>[1-9]\d*)\*)?(?:(?P<wait>wait)|(?P<raise>raise)|sleep\((?P<ms>\d+)\))$"
)


class FailpointError(Exception):
    """Raised where a failpoint armed with ``raise`` is reached."""


@dataclass(slots=True)
class _Armed:
    sleep_ms: int | None  # None: wait to be killed
    times: int | None  # None: every time
    raises: bool = False


def parse(spec: str) -> dict[str, _Armed]:
    """The failpoints a ``PGPLANE_FAILPOINTS`` value arms; ValueError if it does not parse."""
    armed: dict[str, _Armed] = {}
    for item in spec.split(","):
        name, _, action = item.strip().partition("=")
        name, action = name.strip(), action.strip() or "wait"
        if not name:
            continue
        m = _ACTION.match(action)
        if m is None:
            raise ValueError(
                f"{ENV}: {item.strip()!r}: the action must be wait, sleep(MS) or raise, "
                "optionally after N*"
            )
        times = None if m["times"] is None else int(m["times"])
        sleep_ms = None if m["ms"] is None else int(m["ms"])
        armed[name] = _Armed(sleep_ms=sleep_ms, times=times, raises=m["raise"] is not None)
    return armed


_armed = parse(os.environ.get(ENV, ""))


def _take(name: str) -> _Armed | None:
    armed = _armed.get(name)
    if armed is None:
        return None
    if armed.times is not None:
        armed.times -= 1
        if armed.times == 0:
            del _armed[name]
    if armed.raises:
        log.warning("failpoint %s reached: raising", name)
        raise FailpointError(f"failpoint {name} raised")
    if armed.sleep_ms is None:
        log.warning("failpoint %s reached: waiting to be killed", name)
    else:
        log.warning("failpoint %s reached: pausing %d ms", name, armed.sleep_ms)
    return armed


async def reached(name: str) -> None:
    """Act as ``name`` is armed to (wait forever, pause, raise); return at once if it is not."""
    armed = _take(name)
    if armed is None:
        return
    if armed.sleep_ms is None:
        await asyncio.Event().wait()
        return
    await asyncio.sleep(armed.sleep_ms / 1000)
    log.info("failpoint %s: going on", name)


def reached_in_thread(name: str) -> None:
    """``reached`` for blocking code run off the event loop (a worker thread's step)."""
    armed = _take(name)
    if armed is None:
        return
    if armed.sleep_ms is None:
        threading.Event().wait()
        return
    time.sleep(armed.sleep_ms / 1000)
    log.info("failpoint %s: going on", name)
