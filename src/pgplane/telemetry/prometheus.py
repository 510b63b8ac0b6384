"""The platform's figures kept for Prometheus, in a registry of their own (``prometheus_client``)
and exposed in its text format at ``GET /metrics``.

Every label takes a value from a small fixed set (an action, a status, a state, a reason): no
project, endpoint, account or address ever becomes a label, so the number of series is bounded
whatever tenants do, and nothing a scrape shows names a tenant. Names follow Prometheus' naming
guide: the ``pgplane_`` prefix, base units (seconds) in the name, ``_total`` on counters.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from pgplane.telemetry.metrics import Metrics

if TYPE_CHECKING:
    from pgplane.compute.model import ShippingRound

CONTENT_TYPE = CONTENT_TYPE_LATEST
# A scrape renders at most once a second: /metrics answers without a key, and a flood of scrapes
# then costs what a flood of /livez does, not a rendering each.
REUSE_SECONDS = 1.0

# Operations take from milliseconds (a config change) to an hour (a copy of a large branch).
_OPERATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800)
# A wake is a postmaster start, perhaps after a reattach from the cold archive.
_WAKE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 600)
# A write transaction is tens of microseconds plus an fsync; seconds only when something is wrong.
_STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# A tick is late when the event loop was busy: milliseconds are normal, a second is a stall.
_LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Prometheus(Metrics):
    """The figures kept, in a registry of this object's own."""

    enabled = True

    def __init__(self, *, version: str, actions: Iterable[str], node: str = "") -> None:
        # prometheus_client adds a ``…_created`` series per counter and histogram by default: a
        # timestamp no alert uses, and ``pgplane_operations_created`` reads as a count it is not.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry = CollectorRegistry()
        ProcessCollector(registry=registry)  # memory, CPU and descriptors of this process
        Gauge(
            "pgplane_build_info", "The running pgplane's version.", ["version"], registry=registry
        ).labels(version).set(1)
        # The node's name: one series, so a dashboard joins on it (every figure here is this
        # node's own: the operations it ran, its proxy's sessions, its store latency).
        Gauge(
            "pgplane_node_info", "This node of the platform, by name.", ["node"], registry=registry
        ).labels(node).set(1)
        self._last_beat = time.monotonic()
        Gauge(
            "pgplane_node_heartbeat_age_seconds",
            "Time since this node last recorded its heartbeat in the store.",
            registry=registry,
        ).set_function(lambda: time.monotonic() - self._last_beat)
        self._operations = Counter(
            "pgplane_operations_total",
            "Operations that ended, by action and status (finished or failed).",
            ["action", "status"],
            registry=registry,
        )
        self._retries = Counter(
            "pgplane_operation_retries_total",
            "Failed attempts of operations that were then tried again, by action.",
            ["action"],
            registry=registry,
        )
        self._durations = Histogram(
            "pgplane_operation_duration_seconds",
            "Time operations spent in their attempts, counted when they end, by action.",
            ["action"],
            buckets=_OPERATION_BUCKETS,
            registry=registry,
        )
        for action in actions:  # every series from the start, so a first failure shows as one
            for status in ("finished", "failed"):
                self._operations.labels(action, status)
            self._retries.labels(action)
        self._wakes = Histogram(
            "pgplane_compute_wake_seconds",
            "Time from a client's connection needing a compute to the compute started.",
            buckets=_WAKE_BUCKETS,
            registry=registry,
        )
        self._wake_failures = Counter(
            "pgplane_compute_wake_failures_total",
            "Compute starts for proxy clients that failed or timed out.",
            registry=registry,
        )
        self._computes = Gauge(
            "pgplane_computes",
            "Computes by state, as of the scheduler's last tick.",
            ["state"],
            registry=registry,
        )
        # An endpoint's current_state: each shown from the start, at 0 when no compute is in it.
        self._states = {"init", "active", "idle"}
        self._open = Gauge(
            "pgplane_proxy_open_connections",
            "Client connections through the proxy joined to a compute, now.",
            registry=registry,
        )
        self._opened = Counter(
            "pgplane_proxy_connections_total",
            "Client connections through the proxy joined to a compute.",
            registry=registry,
        )
        self._auth_failures = Counter(
            "pgplane_proxy_auth_failures_total",
            "Failed logins through the proxy.",
            registry=registry,
        )
        self._write_wait = Histogram(
            "pgplane_store_write_wait_seconds",
            "Time write transactions waited for the store's writer (ours or another process').",
            buckets=_STORE_BUCKETS,
            registry=registry,
        )
        self._write = Histogram(
            "pgplane_store_write_seconds",
            "Time write transactions held the store's writer, commit included.",
            buckets=_STORE_BUCKETS,
            registry=registry,
        )
        self._store_errors = Counter(
            "pgplane_store_errors_total",
            "Times the store was unavailable, by reason.",
            ["reason"],
            registry=registry,
        )
        self._lag = Histogram(
            "pgplane_scheduler_lag_seconds",
            "How late the scheduler's ticks began.",
            buckets=_LAG_BUCKETS,
            registry=registry,
        )
        self._page = b""
        self._rendered_at = -REUSE_SECONDS
        self._shipping(registry)

    def _shipping(self, registry: CollectorRegistry) -> None:
        """What is kept only on this disk yet, with shared or object storage (none without)."""
        self._archive_lag = Gauge(
            "pgplane_archive_lag_seconds",
            "Age of the oldest WAL file archived here and not yet shipped, of any branch, as of"
            " the last shipping round (0: everything shipped).",
            registry=registry,
        )
        self._archive_unshipped = Gauge(
            "pgplane_archive_unshipped_bytes",
            "Bytes of archived WAL not yet shipped, all branches, as of the last round.",
            registry=registry,
        )
        self._ship_failures = Counter(
            "pgplane_archive_ship_failures_total",
            "Branches whose history a shipping round could not ship (the store down, refusing).",
            registry=registry,
        )
        self._shipped_files = Counter(
            "pgplane_archive_shipped_files_total",
            "WAL files and base states stored by the shipping rounds.",
            registry=registry,
        )
        self._store_copy_failures = Counter(
            "pgplane_store_copy_failures_total",
            "Copies of the platform's store to the object store that failed.",
            registry=registry,
        )
        self._started = time.monotonic()
        self._store_copied_at: float | None = None
        Gauge(
            "pgplane_store_copy_age_seconds",
            "Time since the platform's store was last copied to the object store (or since"
            " start, before the first copy).",
            registry=registry,
        ).set_function(lambda: time.monotonic() - (self._store_copied_at or self._started))
        self._verified_at = Gauge(
            "pgplane_backup_verify_last_run_timestamp_seconds",
            "When this node's last check that its branches' backups restore ended (0: none"
            " since start).",
            registry=registry,
        )
        self._verify_failed = Gauge(
            "pgplane_backup_verify_failed_branches",
            "Branches whose backups did not restore in this node's last check.",
            registry=registry,
        )
        self._verify_errors = Counter(
            "pgplane_backup_verify_errors_total",
            "Checks of the backups that could not run at all (the object store, the scratch).",
            registry=registry,
        )

    def operation_settled(self, action: str, status: str, seconds: float) -> None:
        self._operations.labels(action, status).inc()
        self._durations.labels(action).observe(seconds)

    def operation_retried(self, action: str) -> None:
        self._retries.labels(action).inc()

    def wake(self, seconds: float, *, failed: bool) -> None:
        if failed:
            self._wake_failures.inc()
        else:
            self._wakes.observe(seconds)

    def proxy_opened(self) -> None:
        self._opened.inc()
        self._open.inc()

    def proxy_closed(self) -> None:
        self._open.dec()

    def proxy_auth_failed(self) -> None:
        self._auth_failures.inc()

    def store_write(self, wait: float, held: float) -> None:
        self._write_wait.observe(wait)
        self._write.observe(held)

    def store_error(self, reason: str) -> None:
        self._store_errors.labels(reason).inc()

    def scheduler_tick(self, lag: float) -> None:
        self._lag.observe(lag)

    def node_heartbeat(self) -> None:
        self._last_beat = time.monotonic()

    def computes(self, states: Iterable[str]) -> None:
        counts: dict[str, int] = dict.fromkeys(self._states, 0)
        for state in states:
            counts[state] = counts.get(state, 0) + 1
        self._states.update(counts)  # a state once seen stays, as the usual ones do
        for state, count in counts.items():
            self._computes.labels(state).set(count)

    def shipping_round(self, done: ShippingRound) -> None:
        self._archive_lag.set(done.lag_seconds)
        self._archive_unshipped.set(done.unshipped_bytes)
        self._ship_failures.inc(done.failed)
        self._shipped_files.inc(done.files)

    def store_copied(self, *, failed: bool) -> None:
        if failed:
            self._store_copy_failures.inc()
        else:
            self._store_copied_at = time.monotonic()

    def backups_verified(self, *, branches: int, failed: int | None) -> None:
        if failed is None:
            self._verify_errors.inc()
            return
        self._verified_at.set(time.time())
        self._verify_failed.set(failed)

    def render(self) -> bytes:
        """The exposition, rendered again at most once per ``REUSE_SECONDS``."""
        now = time.monotonic()
        if now - self._rendered_at >= REUSE_SECONDS:
            self._page = generate_latest(self.registry)
            self._rendered_at = now
        return self._page
