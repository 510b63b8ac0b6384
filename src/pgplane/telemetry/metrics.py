"""Where the platform's parts report their figures (``GET /metrics``).

The parts (store, engine, scheduler, proxy, gateway) take a :class:`Metrics` and call it as
things happen. This base does nothing, so a part made without one (a unit test, the CLI's store)
or a server started with metrics off pays one empty method call per event and never imports the
Prometheus client; :class:`pgplane.telemetry.prometheus.Prometheus` keeps the figures.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgplane.compute.model import ShippingRound


class Metrics:
    """Where the platform's parts report; this one forgets everything (metrics off)."""

    enabled = False

    def operation_settled(self, action: str, status: str, seconds: float) -> None:
        """An operation ended ``finished`` or ``failed`` after ``seconds`` of attempts."""

    def operation_retried(self, action: str) -> None:
        """An attempt failed and the operation waits to be tried again."""

    def wake(self, seconds: float, *, failed: bool) -> None:
        """The proxy had a compute started for a client (once per start, however many wait)."""

    def proxy_opened(self) -> None:
        """A client logged in through the proxy and was joined to its compute."""

    def proxy_closed(self) -> None:
        """Such a session ended."""

    def proxy_auth_failed(self) -> None:
        """A login through the proxy failed (wrong password, unknown role)."""

    def store_write(self, wait: float, held: float) -> None:
        """A write transaction waited ``wait`` s for the writer and held it ``held`` s."""

    def store_error(self, reason: str) -> None:
        """The store was unavailable: locked, full, an I/O error, damaged."""

    def scheduler_tick(self, lag: float) -> None:
        """A scheduler tick began ``lag`` s after it was due."""

    def node_heartbeat(self) -> None:
        """This node's heartbeat was recorded in the store just now."""

    def computes(self, states: Iterable[str]) -> None:
        """The live computes' states, as the scheduler read them this tick."""

    def shipping_round(self, done: ShippingRound) -> None:
        """A round of shipping history to shared or object storage ended."""

    def store_copied(self, *, failed: bool) -> None:
        """A copy of the store to the object store went up, or failed to."""

    def backups_verified(self, *, branches: int, failed: int | None) -> None:
        """The platform's own check of its backups ran over ``branches``: ``failed`` of them
        did not restore (None: the check itself could not run)."""


NO_METRICS = Metrics()
