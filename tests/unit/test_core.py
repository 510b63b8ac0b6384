"""Pure domain logic: time, ids, keys, the operation state machine and ordering."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgplane.core import clock, ids, keys
from pgplane.core.models import Operation
from pgplane.core.operations import (
    Action,
    IllegalTransition,
    RetryPolicy,
    Scope,
    Status,
    check_transition,
    claimable,
)
from pgplane.serverlock import AlreadyServing, ServerLock


def test_timestamps_round_trip_with_microseconds() -> None:
    us = 1_737_061_324_214_837
    text = clock.format_us(us)
    assert text == "2025-01-16T21:02:04.214837Z"
    assert clock.parse_us(text) == us
    assert clock.parse_us("2025-01-16T21:02:04Z") == us - 214_837
    assert clock.parse_us("2025-01-16T21:02:04.214837123+00:00") == us
    assert clock.format_s(us) == "2025-01-16T21:02:04Z"


def test_any_rfc_3339_time_is_read() -> None:
    """A cursor may be any RFC 3339 time (the document says ``date-time``)."""
    us = clock.parse_us("2025-01-16T21:02:04.214837Z")
    assert clock.parse_us("2025-01-16T22:02:04.214837+01:00") == us
    assert clock.parse_us("2025-01-16t16:32:04.214837-04:30") == us
    assert clock.parse_us("2016-12-31T23:59:60Z") == clock.parse_us("2017-01-01T00:00:00Z") - 1
    assert clock.parse_us("2024-02-29T00:00:00Z") - clock.parse_us("2024-02-28T00:00:00Z") == (
        86_400_000_000
    )
    assert clock.parse_us("1970-01-01T00:00:00Z") == 0
    assert clock.parse_us("0000-01-01T00:00:00Z") == -62_167_219_200_000_000
    assert clock.parse_us("9999-12-31T23:59:59Z") == 253_402_300_799_000_000


@pytest.mark.parametrize(
    "text",
    [
        "",
        "yesterday",
        "2025-01-16T21:02:04",
        "2025-02-30T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2025-13-01T00:00:00Z",
        "2025-01-16T24:00:00Z",
        "2025-01-16T21:02:04+24:00",
        "2025-01-16T21:02:04Z\n",
        "\u0662025-01-16T21:02:04Z",
    ],
)
def test_bad_timestamps_are_rejected(text: str) -> None:
    with pytest.raises(ValueError, match=r"timestamp"):
        clock.parse_us(text)


def test_ids_have_neon_formats() -> None:
    assert ids.ID_PATTERN.fullmatch(ids.new_project_id())
    assert ids.new_branch_id().startswith("br-")
    assert ids.new_endpoint_id().startswith("ep-")
    assert ids.is_valid_uuid(ids.new_operation_id())
    assert not ids.is_valid_uuid("not-a-uuid")
    assert not ids.is_valid_id("../etc")
    assert ids.new_password().startswith("npg_")


def test_keys_are_self_checking() -> None:
    value = keys.generate()
    assert len(value) == keys.KEY_LENGTH
    assert value.startswith(keys.PREFIX)
    assert keys.is_well_formed(value)
    flipped = value[:10] + ("A" if value[10] != "A" else "B") + value[11:]
    assert not keys.is_well_formed(flipped)
    assert not keys.is_well_formed(value[:-1])
    assert not keys.is_well_formed("x" * 64)
    assert keys.digest(value) != value and len(keys.digest(value)) == 64


def test_state_machine_edges() -> None:
    check_transition(Status.SCHEDULING, Status.RUNNING)
    check_transition(Status.RUNNING, Status.FINISHED)
    check_transition(Status.RUNNING, Status.SCHEDULING)
    for settled in (Status.FINISHED, Status.FAILED):
        for target in Status:
            with pytest.raises(IllegalTransition):
                check_transition(settled, target)
    with pytest.raises(IllegalTransition):
        check_transition(Status.SCHEDULING, Status.FINISHED)


def test_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(max_attempts=5, base_seconds=1, cap_seconds=5)
    assert [policy.backoff_seconds(n) for n in range(1, 6)] == [1, 2, 4, 5, 5]
    assert not policy.exhausted(4)
    assert policy.exhausted(5)


def _op(n: int, branch: str | None, status: Status = Status.SCHEDULING, **kw: object) -> Operation:
    fields: dict[str, object] = {
        "id": f"op{n}", "project_id": "p", "branch_id": branch, "endpoint_id": None,
        "action": Action.START_COMPUTE, "status": status, "failures_count": 0, "error": None,
        "retry_at": None, "created_at": n, "updated_at": n, "total_duration_ms": 0,
    }  # fmt: skip
    fields.update(kw)
    return Operation(**fields)  # type: ignore[arg-type]


def test_scopes_overlap_within_a_branch_and_for_project_wide_work() -> None:
    assert Scope("p", "b1", None).overlaps(Scope("p", "b1", "e"))
    assert not Scope("p", "b1", None).overlaps(Scope("p", "b2", None))
    assert Scope("p", None, None).overlaps(Scope("p", "b2", None))
    assert not Scope("p", None, None).overlaps(Scope("q", None, None))


def test_claimable_respects_order_per_branch() -> None:
    ops = [_op(1, "b1"), _op(2, "b1"), _op(3, "b2")]
    assert [o.id for o in claimable(ops, now=10)] == ["op1", "op3"]


def test_a_running_operation_blocks_its_successors_until_its_lease_ends() -> None:
    running = _op(1, "b1", Status.RUNNING, lease_owner="w", lease_expires_at=100)
    ops = [running, _op(2, "b1")]
    assert claimable(ops, now=50) == []
    assert [o.id for o in claimable(ops, now=100)] == ["op1"]


def test_retry_waits_for_its_time_and_blocks_successors() -> None:
    ops = [_op(1, "b1", retry_at=100), _op(2, "b1"), _op(3, None)]
    assert claimable(ops, now=50) == []
    assert [o.id for o in claimable(ops, now=100)] == ["op1"]


def test_project_wide_operation_waits_for_all_and_blocks_all() -> None:
    ops = [_op(1, "b1"), _op(2, None), _op(3, "b2")]
    assert [o.id for o in claimable(ops, now=10)] == ["op1"]


def test_the_serve_lock_is_exclusive_and_names_its_holder(tmp_path: Path) -> None:
    first = ServerLock(tmp_path)
    first.acquire()
    with pytest.raises(AlreadyServing) as refused:
        ServerLock(tmp_path).acquire()
    assert refused.value.pid == os.getpid()
    first.release()
    again = ServerLock(tmp_path)
    again.acquire()  # released: free again
    again.release()
