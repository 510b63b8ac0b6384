"""The figures and the log lines, piece by piece: what each report adds, what a JSON line holds,
and the ids each kind of work puts in its lines."""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pgplane.config import Settings
from pgplane.core.operations import Action
from pgplane.proxy.activity import Activity
from pgplane.proxy.throttle import LoginThrottle
from pgplane.services import accounts, projects
from pgplane.store.sqlite import SqliteStore
from pgplane.store.sqlite.store import fault_reason
from pgplane.telemetry import logs
from pgplane.telemetry.metrics import NO_METRICS
from pgplane.telemetry.prometheus import Prometheus
from tests.support import no_pg_settings


def _metrics() -> Prometheus:
    return Prometheus(version="9.9.9", actions=Action)


def _samples(metrics: Prometheus) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    metrics._rendered_at = -1e9
    text = metrics.render().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_action_has_its_series_from_the_start() -> None:
    samples = _samples(_metrics())
    for action in Action:
        for status in ("finished", "failed"):
            key = ("pgplane_operations_total", (("action", action.value), ("status", status)))
            assert samples[key] == 0
    assert samples[("pgplane_build_info", (("version", "9.9.9"),))] == 1
    # No ``…_created`` series: a timestamp read as a count.
    assert not [name for name, _ in samples if name.endswith("_created")]


def test_operations_are_counted_by_action_and_status_with_their_durations() -> None:
    metrics = _metrics()
    metrics.operation_settled("create_branch", "finished", 2.0)
    metrics.operation_settled("create_branch", "failed", 0.5)
    metrics.operation_retried("create_branch")
    samples = _samples(metrics)
    ops = "pgplane_operations_total"
    assert samples[(ops, (("action", "create_branch"), ("status", "finished")))] == 1
    assert samples[(ops, (("action", "create_branch"), ("status", "failed")))] == 1
    retries = ("pgplane_operation_retries_total", (("action", "create_branch"),))
    assert samples[retries] == 1
    count = ("pgplane_operation_duration_seconds_count", (("action", "create_branch"),))
    total = ("pgplane_operation_duration_seconds_sum", (("action", "create_branch"),))
    assert (samples[count], samples[total]) == (2, 2.5)


def test_computes_by_state_drop_to_zero_when_none_is_left() -> None:
    metrics = _metrics()
    metrics.computes(["active", "active", "idle", "resetting"])
    samples = _samples(metrics)
    state = "pgplane_computes"
    assert samples[(state, (("state", "active"),))] == 2
    assert samples[(state, (("state", "resetting"),))] == 1
    assert samples[(state, (("state", "init"),))] == 0
    metrics.computes([])
    samples = _samples(metrics)
    assert {v for (name, _), v in samples.items() if name == state} == {0}


def test_a_scrape_flood_renders_once_a_second() -> None:
    metrics = _metrics()
    first = metrics.render()
    metrics.proxy_auth_failed()
    assert metrics.render() is first  # within the second: the page already rendered
    metrics._rendered_at = -1e9
    assert b"pgplane_proxy_auth_failures_total 1.0" in metrics.render()


def test_proxy_sessions_and_failed_logins_are_counted() -> None:
    metrics = _metrics()
    activity = Activity(metrics)
    a, b = activity.open("ep-a", now=1), activity.open("ep-a", now=1)
    activity.close(a, now=2)
    activity.close(a, now=3)  # closed twice (a door's cleanup after the pipe's): counted once
    samples = _samples(metrics)
    assert samples[("pgplane_proxy_connections_total", ())] == 2
    assert samples[("pgplane_proxy_open_connections", ())] == 1
    activity.close(b, now=4)
    assert _samples(metrics)[("pgplane_proxy_open_connections", ())] == 0

    throttle = LoginThrottle(failures_per_minute=0, metrics=metrics)  # counted even unthrottled
    throttle.failed("ep-a", "127.0.0.1")
    throttle.failed("ep-a", "127.0.0.1")
    assert _samples(metrics)[("pgplane_proxy_auth_failures_total", ())] == 2


def test_without_metrics_reports_cost_nothing_and_keep_nothing() -> None:
    NO_METRICS.operation_settled("create_branch", "finished", 1.0)
    NO_METRICS.computes(iter(["active"]))
    assert not NO_METRICS.enabled
    assert not hasattr(NO_METRICS, "render")


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (sqlite3.SQLITE_BUSY, "locked"),
        (sqlite3.SQLITE_FULL, "full"),
        (sqlite3.SQLITE_IOERR | (3 << 8), "io"),  # an extended code: SQLITE_IOERR_WRITE
        (sqlite3.SQLITE_CORRUPT, "corrupt"),
        (sqlite3.SQLITE_PERM, "other"),
    ],
)
def test_store_faults_are_named_by_a_few_words(code: int, reason: str) -> None:
    exc = sqlite3.OperationalError("whatever the message says")
    exc.sqlite_errorcode = code
    assert fault_reason(exc) == reason


# Logs ---------------------------------------------------------------------------------------


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("pgplane.test", logging.WARNING, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_json_line_is_one_object_with_the_ids_in_context() -> None:
    def in_request() -> str:
        logs.request_id.set("req-1")
        logs.project_id.set("proj-1")
        return logs.JsonFormatter().format(_record("role %s made", "evil\nname\u2028"))

    line = contextvars.copy_context().run(in_request)
    assert "\n" not in line
    entry = json.loads(line)
    assert entry["message"] == "role evil\nname\u2028 made"  # escaped, never a line of its own
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "pgplane.test"
    assert entry["time"].endswith("Z")
    assert (entry["request_id"], entry["project_id"]) == ("req-1", "proj-1")
    assert "operation_id" not in entry  # only the ids there are


def test_ids_given_with_a_line_name_it_and_exceptions_come_along() -> None:
    def boom() -> None:
        raise ValueError("boom")

    try:
        boom()
    except ValueError:
        record = _record("failed", operation_id="op-9")
        record.exc_info = sys.exc_info()
    entry = json.loads(logs.JsonFormatter().format(record))
    assert entry["operation_id"] == "op-9"
    assert "ValueError: boom" in entry["exception"]


def test_an_operation_carries_the_request_that_queued_it() -> None:
    def queue() -> None:
        logs.request_id.set("req-7")
        logs.queued("op-7")

    def attempt() -> tuple[str | None, str | None, str | None]:
        logs.in_operation("op-7", project="proj-7", branch=None, endpoint="ep-7")
        return logs.request_id.get(), logs.operation_id.get(), logs.endpoint_id.get()

    contextvars.copy_context().run(queue)
    assert contextvars.copy_context().run(attempt) == ("req-7", "op-7", "ep-7")
    # Not another task's: the attempt's context alone.
    assert logs.operation_id.get() is None


def test_remembered_requests_are_bounded() -> None:
    def queue_many() -> None:
        logs.request_id.set("req-many")
        for i in range(logs._REMEMBERED + 10):
            logs.queued(f"op-many-{i}")

    contextvars.copy_context().run(queue_many)
    assert len(logs._asked_by) <= logs._REMEMBERED
    assert "op-many-0" not in logs._asked_by


# The store: timed writes, and queued operations said once committed ---------------------------


@pytest.fixture
def store_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.INFO, logger="pgplane.store.sqlite.store"):
        yield caplog


async def test_queued_operations_are_said_after_the_commit_only(
    tmp_path: Path, store_log: pytest.LogCaptureFixture
) -> None:
    metrics = _metrics()
    store = SqliteStore(tmp_path / "store.db", metrics)
    settings = Settings(pg_versions=(16,), compute_ports=(45000, 45999))
    try:

        async def create(name: str) -> list[str]:
            async with store.write() as tx:
                account = await accounts.ensure(tx, email="t@example.com")
                created = await projects.create(
                    tx,
                    account_id=account.id,
                    spec=projects.NewProject(name=name),
                    settings=settings,
                    check_settings=no_pg_settings,
                )
                if name == "rolled-back":
                    raise asyncio.CancelledError  # the caller gone before the commit
            return [o.id for o in created.operations]

        with pytest.raises(asyncio.CancelledError):
            await create("rolled-back")
        assert not [r for r in store_log.records if "queued" in r.getMessage()]
        op_ids = await create("kept")
    finally:
        await store.close()
    queued = [r for r in store_log.records if "queued" in r.getMessage()]
    assert [getattr(r, "operation_id", None) for r in queued] == op_ids
    samples = _samples(metrics)
    # Committed writes are timed (the rolled back one is not).
    assert samples[("pgplane_store_write_seconds_count", ())] == 1
    assert samples[("pgplane_store_write_wait_seconds_count", ())] == 1
