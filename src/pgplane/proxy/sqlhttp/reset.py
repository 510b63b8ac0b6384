"""A pooled compute connection put back as a new session finds it, before each request.

What a request leaves on its session (``SET``, temporary tables, prepared statements, cursors
held open, ``LISTEN``, advisory locks, a ``SET ROLE``) must never reach the next request, which
may come from another client of the same role. ``DISCARD ALL`` undoes all of it, and refuses to
run in a transaction block, so a connection left in one cannot pass either.

It goes ahead of the next request's own messages, in the same write (:data:`AHEAD`): Parse,
Bind and Execute of ``DISCARD ALL`` with no Sync of its own, so it is the first statement of
the request's pipeline. Postgres runs it first and commits it at once (it may not run in a
transaction); if it fails, Postgres skips every message up to the request's Sync, so nothing of
the request runs on a session that was not reset: the request is tried again on a new
connection (:mod:`pgplane.proxy.sqlhttp.run` reads its answer first). This costs the proxy no
write, no reply and no wake-up of its own.

Until then the session keeps what the last request left: a lock it took stays held while the
connection is idle. So a connection left idle for :data:`SETTLE_SECONDS` is reset where it is
(:func:`discard_all`: the simple query, whose answer is read in the background and checked
exactly; a connection whose reset fails is closed), and a busy key never pays for that. The
reset is not written as the connection is given back, with no Sync: a backend that has not
seen a Sync shows as ``active`` in ``pg_stat_activity``, and that would keep an idle compute up.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from pgplane.proxy.framing import MAX_AUTH_FRAME, FrameError
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp import messages

AHEAD = messages.statement("DISCARD ALL")  # no Sync: the request's own ends its pipeline
RESET = messages.simple_query("DISCARD ALL")
DONE = b"DISCARD ALL\0"  # the reset's CommandComplete
# How long what a request left may stay on an idle connection: short beside any lock wait that
# matters, long beside the gap between a busy key's requests (which never pay the idle reset).
SETTLE_SECONDS = 0.1
# A healthy compute answers in well under a millisecond; one that does not answer in this long
# is not one to hand a request to.
RESET_SECONDS = 5.0
# What a session may send between a command and its completion without saying anything about
# the command: a notice, a parameter status (RESET ALL reports what it put back), a notification
# queued before UNLISTEN.
ASIDES = frozenset({b"N", b"S", b"A"})


def discard_all(side: Side) -> Coroutine[Any, Any, bool]:
    """Reset the idle session on ``side``: ``DISCARD ALL`` is written now, and the coroutine
    returned reads its answer: True only if the session is verified idle and clean."""
    side.write(RESET)
    return _verified(side)


async def _verified(side: Side) -> bool:
    done = False
    try:
        async with asyncio.timeout(RESET_SECONDS):
            while True:
                kind, payload = await side.read_frame(limit=MAX_AUTH_FRAME)
                if kind == b"C" and not done:
                    done = payload == DONE
                    if not done:
                        return False
                elif kind == b"Z":
                    return done and payload == b"I" and not side.unread()
                elif kind not in ASIDES:
                    return False  # an error (a transaction block, a shutdown) or confusion
    except (Closed, ConnectionError, FrameError, TimeoutError):
        return False
