"""Which endpoints the proxy has seen used, and when: the input to idle suspend.

Counting is cheap on purpose: a piped session's count is the kernel's, its client's TCP bytes
(or the kernel relay's), read only as it is sampled; where there is none the pipe adds one to a
counter per chunk it forwards. Turning counts into times happens once per scheduler tick, in
:meth:`Activity.sample`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from pgplane.telemetry.metrics import NO_METRICS, Metrics


class Session:
    """One client connection through the proxy to an endpoint."""

    __slots__ = ("endpoint_id", "kernel", "seen", "ticks")

    def __init__(self, endpoint_id: str) -> None:
        self.endpoint_id = endpoint_id
        self.ticks = 0  # chunks forwarded in either direction
        self.seen = -1  # ``count()`` at the last sample
        # A count the kernel keeps for the session (pgplane.proxy.pipe.tcp_activity, or the
        # kernel relay's), read when sampled.
        self.kernel: Callable[[], int] | None = None

    def count(self) -> int:
        """What changes while the session is used."""
        return self.ticks if self.kernel is None else self.ticks + self.kernel()


class Activity:
    def __init__(self, metrics: Metrics = NO_METRICS) -> None:
        # Every session the proxy joins to a compute opens and closes here, whatever the door.
        self._metrics = metrics
        self._open: defaultdict[str, set[Session]] = defaultdict(set)
        self._changed: dict[str, int] = {}

    def open(self, endpoint_id: str, now: int) -> Session:
        session = Session(endpoint_id)
        self._open[endpoint_id].add(session)
        self._changed[endpoint_id] = now
        self._metrics.proxy_opened()
        return session

    def close(self, session: Session, now: int) -> None:
        sessions = self._open.get(session.endpoint_id)
        if sessions is not None and session in sessions:
            sessions.discard(session)
            if not sessions:
                del self._open[session.endpoint_id]
            self._metrics.proxy_closed()
        # A count read off the kernel may be one sample old once the connection is closed: its
        # end (a Terminate, a close) is taken as the session's last use, as the pipe counts it.
        if session.kernel is not None or session.count() != session.seen:
            self._changed[session.endpoint_id] = now

    def connections(self, endpoint_id: str) -> int:
        return len(self._open.get(endpoint_id, ()))

    def sample(self, now: int) -> dict[str, int]:
        """Endpoints active since the last sample, with ``now`` (or when they went quiet)."""
        for endpoint_id, sessions in self._open.items():
            for session in sessions:
                count = session.count()
                if count != session.seen:
                    session.seen = count
                    self._changed[endpoint_id] = now
        changed, self._changed = self._changed, {}
        return changed

    def unsampled(self, changed: dict[str, int]) -> None:
        """Give back a sample that could not be written (the store was down): the next sample
        carries it, unless the endpoint was seen again since."""
        for endpoint_id, at in changed.items():
            self._changed[endpoint_id] = max(at, self._changed.get(endpoint_id, at))
