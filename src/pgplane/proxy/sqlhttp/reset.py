"""A pooled compute connection put back as a new session finds it, after each request.

What a request leaves on its session (``SET``, temporary tables, prepared statements, cursors
held open, ``LISTEN``, advisory locks, a ``SET ROLE``) must never reach the next request, which
may come from another client of the same role. ``DISCARD ALL`` undoes all of it, and refuses to
run in a transaction block, so a connection left in one cannot pass either.

It is sent when a request gives its connection back, in the same turn of the loop as the
request's answer (the compute works on it while the client reads its answer), and its reply is
read in the background: the request whose answer is going out never waits for it. The
connection is handed out again only once that reply has come and was exactly the expected one
(the command done, ReadyForQuery idle, nothing else but notices and parameter statuses); a
request that comes back sooner than that waits for it (a round trip on the compute, cheaper
than a new backend). Any error, a close, an unexpected message or no reply within
:data:`RESET_SECONDS`, and the connection is closed instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from pgplane.proxy.framing import MAX_AUTH_FRAME, FrameError
from pgplane.proxy.pipe import Closed, Side
from pgplane.proxy.sqlhttp import messages

RESET = messages.simple_query("DISCARD ALL")
# A healthy compute answers in well under a millisecond; one that does not answer in this long
# is not one to hand a request to.
RESET_SECONDS = 5.0
_DONE = b"DISCARD ALL\0"
# What a session may send between a command and its completion without saying anything about
# the command: a notice, a parameter status (RESET ALL reports what it put back), a notification
# queued before UNLISTEN.
_ASIDES = frozenset({b"N", b"S", b"A"})


def discard_all(side: Side) -> Coroutine[Any, Any, bool]:
    """Reset the session on ``side``: ``DISCARD ALL`` is written now (it leaves with the
    request's answer, at the end of the loop's turn), and the coroutine returned reads its answer:
    True only if the session is verified idle and clean."""
    side.write(RESET)
    return _verified(side)


async def _verified(side: Side) -> bool:
    done = False
    try:
        async with asyncio.timeout(RESET_SECONDS):
            while True:
                kind, payload = await side.read_frame(limit=MAX_AUTH_FRAME)
                if kind == b"C" and not done:
                    done = payload == _DONE
                    if not done:
                        return False
                elif kind == b"Z":
                    return done and payload == b"I" and not side.unread()
                elif kind not in _ASIDES:
                    return False  # an error (a transaction block, a shutdown) or confusion
    except (Closed, ConnectionError, FrameError, TimeoutError):
        return False
