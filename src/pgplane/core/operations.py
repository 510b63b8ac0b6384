"""The operation state machine, ordering rule and retry policy.

::

    scheduling ──claim──► running ──success──► finished
        ▲                   │  │
        └──retry (backoff)──┘  └──last attempt fails──► failed

A ``running`` operation whose lease has expired (its worker died) is claimed again; that counts
as a failed attempt. Illegal transitions raise :class:`IllegalTransition`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pgplane.core.models import Operation


class Status(enum.StrEnum):
    SCHEDULING = "scheduling"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"

    @property
    def settled(self) -> bool:
        return self in (Status.FINISHED, Status.FAILED)


class Action(enum.StrEnum):
    # An anonymized branch's masking (services/anonymized.py); shown as Neon's apply_config.
    ANONYMIZE = "anonymize"
    APPLY_CONFIG = "apply_config"
    APPLY_STORAGE_CONFIG = "apply_storage_config"
    CHECK_AVAILABILITY = "check_availability"
    CREATE_BRANCH = "create_branch"
    CREATE_SNAPSHOT = "create_snapshot"
    CREATE_TIMELINE = "create_timeline"
    DELETE_SNAPSHOT = "delete_snapshot"
    DELETE_TENANT = "delete_tenant"
    DELETE_TIMELINE = "delete_timeline"
    START_COMPUTE = "start_compute"
    SUSPEND_COMPUTE = "suspend_compute"
    TENANT_ATTACH = "tenant_attach"
    TENANT_DETACH = "tenant_detach"
    TENANT_REATTACH = "tenant_reattach"


# Actions whose attempts copy, replay or pack a branch's data: minutes on a large branch (a
# point-in-time rebuild replays up to a day of WAL). The engine runs them in slots of their own,
# at most one per project at a time, so that one project's copies never hold up another's wakes,
# suspends or configuration changes, nor take every slot for copies.
LONG_ACTIONS: frozenset[Action] = frozenset(
    {
        Action.ANONYMIZE,
        Action.CREATE_BRANCH,
        Action.CREATE_SNAPSHOT,
        Action.CREATE_TIMELINE,
        Action.TENANT_ATTACH,
        Action.TENANT_DETACH,
        Action.TENANT_REATTACH,
    }
)


class IllegalTransition(Exception):
    """An operation was asked to move between states the machine does not connect."""


_ALLOWED: dict[Status, frozenset[Status]] = {
    Status.SCHEDULING: frozenset({Status.RUNNING}),
    # running -> running: a new attempt after an expired lease.
    Status.RUNNING: frozenset({Status.RUNNING, Status.SCHEDULING, Status.FINISHED, Status.FAILED}),
    Status.FINISHED: frozenset(),
    Status.FAILED: frozenset(),
}


def check_transition(current: Status, new: Status) -> None:
    """Raise :class:`IllegalTransition` unless ``current -> new`` is an edge of the machine."""
    if new not in _ALLOWED[current]:
        raise IllegalTransition(f"operation cannot go from {current} to {new}")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How failed attempts are retried: exponential backoff up to ``max_attempts``."""

    max_attempts: int = 5
    base_seconds: float = 1.0
    cap_seconds: float = 60.0

    def backoff_seconds(self, failures: int) -> float:
        """Delay before the next attempt once ``failures`` (>= 1) attempts have failed."""
        return float(min(self.cap_seconds, self.base_seconds * 2 ** max(0, failures - 1)))

    def exhausted(self, failures: int) -> bool:
        return failures >= self.max_attempts


@dataclass(frozen=True, slots=True)
class Scope:
    """What an operation acts on, for ordering.

    Operations of one project whose scopes overlap run strictly in creation order; others run in
    parallel. A scope without a branch (project-wide work such as ``delete_tenant``) overlaps
    every operation of its project. A ``create_branch`` also covers the branch it copies
    (``source_branch_id``), so it copies its parent after the parent's earlier work (its creation,
    role changes) and before the parent's later work.
    """

    project_id: str
    branch_id: str | None
    endpoint_id: str | None
    source_branch_id: str | None = None

    @classmethod
    def of(cls, op: Operation) -> Scope:
        return cls(op.project_id, op.branch_id, op.endpoint_id, op.source_branch_id)

    def overlaps(self, other: Scope) -> bool:
        if self.project_id != other.project_id:
            return False
        if self.branch_id is None or other.branch_id is None:
            return True
        mine = {self.branch_id, self.source_branch_id} - {None}
        if mine & {other.branch_id, other.source_branch_id}:
            return True
        return self.endpoint_id is not None and self.endpoint_id == other.endpoint_id


def claimable(unsettled: list[Operation], now: int) -> list[Operation]:
    """The operations a worker may claim now, oldest first.

    ``unsettled`` is every ``scheduling``/``running`` operation of the projects considered, in
    creation order. An operation is blocked while an earlier unsettled one overlaps its scope;
    blocking only ever lifts (later operations never block earlier ones), so a claim decided on a
    slightly stale read is still correct, and the store's compare-and-set settles races.
    """
    ready = []
    seen: list[Scope] = []
    for op in unsettled:
        scope = Scope.of(op)
        blocked = any(scope.overlaps(s) for s in seen)
        seen.append(scope)
        if blocked:
            continue
        due = op.retry_at if op.status is Status.SCHEDULING else op.lease_expires_at
        if due is None or due <= now:
            ready.append(op)
    return ready
