"""Failpoints: named places where a test can stop the platform, to kill it exactly there.

Crash tests need "killed after the side effect, before it was recorded" to be a place, not a
chance timing. As in Neon, the code names such places; ``PGPLANE_FAILPOINTS`` (comma-separated
names, read once at start-up) arms some of them. An armed failpoint logs that it was reached and
then waits forever, holding whatever the code holds there, until the process is killed. Unarmed,
reaching one costs a set lookup.

Names: ``before:<action>`` and ``after:<action>`` around every operation handler (after: its
work is done, the store does not know yet); ``create_branch:copied`` (the copy is durable, not
yet in place); ``tenant_detach:packed`` (the archive is verified, the hot copy still there);
``tenant_reattach:unpacked`` (the data is back in place, the archive not yet removed).
"""

from __future__ import annotations

import asyncio
import logging
import os

log = logging.getLogger(__name__)

ENV = "PGPLANE_FAILPOINTS"
_armed = frozenset(name.strip() for name in os.environ.get(ENV, "").split(",") if name.strip())


async def reached(name: str) -> None:
    """Wait forever here if ``name`` is armed; return at once otherwise."""
    if name in _armed:
        log.warning("failpoint %s reached: waiting to be killed", name)
        await asyncio.Event().wait()
