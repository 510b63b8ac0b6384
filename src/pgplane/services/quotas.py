"""Quotas: how much of a shared machine one account may hold, checked where it would be passed.

Live projects per account, live branches per project, computes running at once per account and
the compute units those may reach (the sum of their ``autoscaling_limit_max_cu``). A refusal is
Neon's 422 with a code naming the quota, and changes nothing.

Each check reads the store in the caller's write transaction, before the write it guards. The
store runs one write transaction at a time, so of two requests racing for the last place the
second sees the first's project, branch or start, and is refused: none can overshoot.

A running compute is one the account asked to run: ``active``, or a start pending (see
:meth:`pgplane.store.base.Tx.list_running_endpoints`); one being suspended has left the count.
"""

from __future__ import annotations

from collections.abc import Sequence

from pgplane.config import Settings
from pgplane.core.models import Endpoint
from pgplane.errors import LimitExceeded
from pgplane.store import Tx

_ASK = "or ask the platform's operator to raise"


async def check_projects(tx: Tx, *, account_id: str, settings: Settings) -> None:
    """Refuse a new project past the account's ``projects_per_account``."""
    quota = settings.projects_per_account
    if quota and await tx.count_projects(account_id) >= quota:
        raise LimitExceeded(
            "projects",
            f"projects limit exceeded: the account has reached its limit of {quota} projects;"
            f" delete one, {_ASK} PGPLANE_PROJECTS_PER_ACCOUNT",
        )


async def check_branches(tx: Tx, *, project_id: str, settings: Settings) -> None:
    """Refuse a new branch past the project's ``branches_per_project``."""
    quota = settings.branches_per_project
    if quota and await tx.count_branches(project_id) >= quota:
        raise LimitExceeded(
            "branches",
            f"branches limit exceeded: the project has reached its limit of {quota} branches;"
            f" delete one, {_ASK} PGPLANE_BRANCHES_PER_PROJECT",
        )


async def check_computes(
    tx: Tx,
    *,
    account_id: str,
    settings: Settings,
    starting: Sequence[Endpoint] = (),
    resized: Endpoint | None = None,
) -> None:
    """Refuse when the account's running computes, with ``starting`` started (new ones not yet
    stored, or stored ones about to start) and ``resized`` at its new size if it runs, would pass
    ``running_computes_per_account`` or ``compute_units_per_account``.

    Only what adds is refused: starting a compute that runs already, or shrinking one, passes
    even when an operator has lowered a quota below what the account runs.
    """
    most, units = settings.running_computes_per_account, settings.compute_units_per_account
    if not (most or units) or not (starting or resized):
        return
    running = {e.id: e for e in await tx.list_running_endpoints(account_id)}
    after = dict(running)
    after.update((e.id, e) for e in starting)
    if resized is not None and resized.id in running:
        after[resized.id] = resized
    if most and len(after) > max(most, len(running)):
        raise LimitExceeded(
            "active_endpoints",
            f"active endpoints limit exceeded: the account already runs {len(running)} computes,"
            f" its limit of {most} at once; suspend one (idle ones suspend on their own),"
            f" {_ASK} PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT",
        )
    before_cu = sum(e.autoscaling_limit_max_cu for e in running.values())
    after_cu = sum(e.autoscaling_limit_max_cu for e in after.values())
    if units and after_cu > max(units, before_cu):
        raise LimitExceeded(
            "compute_units",
            f"compute units limit exceeded: the account's running computes may reach"
            f" {before_cu:g} CU and this would make it {after_cu:g} CU, past its limit of"
            f" {units:g} CU; suspend or shrink a compute (autoscaling_limit_max_cu),"
            f" {_ASK} PGPLANE_COMPUTE_UNITS_PER_ACCOUNT",
        )
