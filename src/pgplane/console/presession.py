"""The pre-sessions of the console's sign-in and sign-up forms: which CSRF token the server gave
to which browser before anyone signed in.

A double-submit cookie proves only that the form and the cookie agree, and a sibling origin that
can set cookies for this host can make them agree; so the token is the server's: a random id in
a cookie names a pre-session, the server keeps the token it issued for that id, and a form
posted with any other token (or an id the server does not hold) is refused.

Kept in the ``serve`` process's memory, as the sign-in throttle is, and bounded: each pre-session
lives an hour after the last page that showed it, the oldest is forgotten when there are too
many (a flood of GETs then costs a browser a reload, never the server its memory), and a sign-in
or sign-up that succeeds ends it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from pgplane.services import signin

_SECOND = 1_000_000_000
LIFETIME_SECONDS = 3600  # long enough to fill a form in, left open in a tab over lunch
CAPACITY = 10_000  # about 3 MB at most; far more browsers than sign in within an hour
_MAX_ID = 128  # a longer cookie is not one this server set


@dataclass(frozen=True, slots=True)
class Issued:
    """The pre-session a form page shows: its id (the cookie) and its token (the form's)."""

    id: str
    token: str
    fresh: bool  # a new id, for which the response must set the cookie


class PreSessions:
    """Pre-session id → (token, when it expires), oldest first.

    Every entry lives the same time after it was last shown and is moved to the end when shown
    again, so the order is also the order of expiry: the expired ones are always at the front.
    Single-threaded, from the event loop, like ``core.gcra.Limit``.
    """

    def __init__(
        self,
        *,
        lifetime_seconds: int = LIFETIME_SECONDS,
        capacity: int = CAPACITY,
        clock: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._lifetime = lifetime_seconds * _SECOND
        self._capacity = capacity
        self._clock = clock
        self._issued: OrderedDict[str, tuple[str, int]] = OrderedDict()

    def issue(self, current: str) -> Issued:
        """The pre-session of a form page: the browser's own (``current``, its cookie) while the
        server still holds it, so that two tabs share one; otherwise a new one."""
        now = self._clock()
        self._forget_expired(now)
        found = self._issued.get(current) if len(current) <= _MAX_ID else None
        if found is not None:
            self._issued[current] = (found[0], now + self._lifetime)
            self._issued.move_to_end(current)
            return Issued(id=current, token=found[0], fresh=False)
        new = Issued(id=secrets.token_urlsafe(32), token=secrets.token_urlsafe(32), fresh=True)
        self._issued[new.id] = (new.token, now + self._lifetime)
        while len(self._issued) > self._capacity:
            self._issued.popitem(last=False)
        return new

    def accepts(self, pre_session: str, token: str) -> bool:
        """Whether ``token`` is the one the server issued to ``pre_session``, still live."""
        found = self._issued.get(pre_session) if pre_session else None
        if found is None or found[1] <= self._clock():
            return False
        return bool(token) and signin.same(token, found[0])

    def end(self, pre_session: str) -> None:
        """Signed in (or up): the pre-session's token is spent."""
        self._issued.pop(pre_session, None)

    def _forget_expired(self, now: int) -> None:
        while self._issued:
            _, (_, expires) = next(iter(self._issued.items()))
            if expires > now:
                return
            self._issued.popitem(last=False)

    def __len__(self) -> int:
        return len(self._issued)
