"""Which endpoints the proxy has seen used, and when: the input to idle suspend.

Counting is cheap on purpose (the pipe adds one to a counter per chunk it forwards); turning
counts into times happens once per scheduler tick, in :meth:`Activity.sample`.
"""

from __future__ import annotations

from collections import defaultdict

from pgplane.telemetry.metrics import NO_METRICS, Metrics


class Session:
    """One client connection through the proxy to an endpoint."""

    __slots__ = ("endpoint_id", "seen", "ticks")

    def __init__(self, endpoint_id: str) -> None:
        self.endpoint_id = endpoint_id
        self.ticks = 0  # chunks forwarded in either direction
        self.seen = -1  # ``ticks`` at the last sample


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
        if session.ticks != session.seen:
            self._changed[session.endpoint_id] = now

    def connections(self, endpoint_id: str) -> int:
        return len(self._open.get(endpoint_id, ()))

    def sample(self, now: int) -> dict[str, int]:
        """Endpoints active since the last sample, with ``now`` (or when they went quiet)."""
        for endpoint_id, sessions in self._open.items():
            for session in sessions:
                if session.ticks != session.seen:
                    session.seen = session.ticks
                    self._changed[endpoint_id] = now
        changed, self._changed = self._changed, {}
        return changed

    def unsampled(self, changed: dict[str, int]) -> None:
        """Give back a sample that could not be written (the store was down): the next sample
        carries it, unless the endpoint was seen again since."""
        for endpoint_id, at in changed.items():
            self._changed[endpoint_id] = max(at, self._changed.get(endpoint_id, at))
