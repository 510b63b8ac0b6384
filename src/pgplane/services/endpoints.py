"""Computes (endpoints): created, resized, configured, started, suspended, restarted, deleted.

A request writes the endpoint's desired state and the operations that realise it; the
postmaster's real state (``current_state``) is written when those operations finish.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from pgplane.config import Settings
from pgplane.core import clock, ids, ports
from pgplane.core.models import Endpoint, Operation, Project
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, Locked, NotFound, Unavailable
from pgplane.services import access, anonymized, compute_settings, names, operations, quotas
from pgplane.store import Tx

log = logging.getLogger(__name__)

# A port stays reserved this long after its endpoint is deleted: the old postmaster stops only
# when the deletion's operation runs.
PORT_HOLD_SECONDS = 120


@dataclass(frozen=True, slots=True)
class EndpointSpec:
    """A new compute; anything left None takes the project's defaults."""

    type: str = "read_write"
    autoscaling_limit_min_cu: float | None = None
    autoscaling_limit_max_cu: float | None = None
    suspend_timeout_seconds: int | None = None
    pg_settings: dict[str, str] | None = None
    disabled: bool = False
    name: str | None = None


@dataclass(frozen=True, slots=True)
class EndpointChanges:
    autoscaling_limit_min_cu: float | None = None
    autoscaling_limit_max_cu: float | None = None
    suspend_timeout_seconds: int | None = None
    pg_settings: dict[str, str] | None = None
    disabled: bool | None = None
    branch_id: str | None = None  # only the endpoint's own branch: computes do not move
    name: str | None = None


async def allocate_port(tx: Tx, settings: Settings) -> int:
    """The lowest compute port in the configured range that no endpoint holds and is free."""
    held_since = clock.now_us() - PORT_HOLD_SECONDS * 1_000_000
    used = await tx.used_ports(held_since=held_since)
    low, high = settings.compute_ports
    for port in range(low, high + 1):
        if port not in used and ports.is_free(port):
            return port
    raise Unavailable("no free compute port: widen the configured compute port range")


async def new_endpoint(
    tx: Tx,
    *,
    project: Project,
    branch_id: str,
    spec: EndpointSpec,
    settings: Settings,
    check_settings: compute_settings.SettingsCheck,
    now: int,
) -> Endpoint:
    """Build and insert an endpoint (no operations): creating one, or a branch with one."""
    if spec.type not in ("read_write", "read_only"):
        raise BadRequest(f"unknown endpoint type {spec.type!r}: read_write or read_only")
    defaults = project.default_endpoint_settings
    low, high = compute_settings.limits(
        compute_settings.cu(
            spec.autoscaling_limit_min_cu
            if spec.autoscaling_limit_min_cu is not None
            else defaults.get("autoscaling_limit_min_cu", compute_settings.MIN_CU),
            "autoscaling_limit_min_cu",
        ),
        compute_settings.cu(
            spec.autoscaling_limit_max_cu
            if spec.autoscaling_limit_max_cu is not None
            else defaults.get("autoscaling_limit_max_cu", compute_settings.MIN_CU),
            "autoscaling_limit_max_cu",
        ),
    )
    timeout = compute_settings.suspend_timeout(
        spec.suspend_timeout_seconds
        if spec.suspend_timeout_seconds is not None
        else defaults.get("suspend_timeout_seconds", 0)
    )
    user_settings = await compute_settings.checked_pg_settings(
        spec.pg_settings if spec.pg_settings is not None else defaults.get("pg_settings", {}),
        pg_version=project.pg_version,
        check=check_settings,
    )
    endpoint = Endpoint(
        id=ids.new_endpoint_id(),
        project_id=project.id,
        branch_id=branch_id,
        type=spec.type,
        current_state="init",
        pending_state=None if spec.disabled else "active",
        port=await allocate_port(tx, settings),
        autoscaling_limit_min_cu=low,
        autoscaling_limit_max_cu=high,
        suspend_timeout_seconds=timeout,
        settings={"pg_settings": user_settings} if user_settings else {},
        disabled=spec.disabled,
        created_at=now,
        updated_at=now,
        name=None if spec.name is None else names.endpoint(spec.name),
    )
    if not endpoint.disabled:
        # Before the insert: once stored, the new compute would count as running already.
        await quotas.check_computes(
            tx, account_id=project.account_id, settings=settings, starting=[endpoint]
        )
    await tx.insert_endpoint(endpoint)
    return endpoint


def start_op(endpoint: Endpoint) -> operations.Start:
    return operations.Start(
        Action.START_COMPUTE, branch_id=endpoint.branch_id, endpoint_id=endpoint.id
    )


def _suspend_op(endpoint: Endpoint) -> operations.Start:
    return operations.Start(
        Action.SUSPEND_COMPUTE, branch_id=endpoint.branch_id, endpoint_id=endpoint.id
    )


async def create(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    branch_id: str,
    spec: EndpointSpec,
    settings: Settings,
    check_settings: compute_settings.SettingsCheck,
) -> tuple[Endpoint, list[Operation]]:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    endpoint = await new_endpoint(
        tx,
        project=project,
        branch_id=branch.id,
        spec=spec,
        settings=settings,
        check_settings=check_settings,
        now=clock.now_us(),
    )
    starts = [] if endpoint.disabled else [start_op(endpoint)]
    if starts and not anonymized.served(await tx.get_masking(branch.id)):
        # Its branch is not masked yet: it starts once it is (a connection wakes it).
        starts = []
        endpoint = await left_idle(tx, endpoint, clock.now_us())
    if endpoint.type == "read_write":
        # The branch's running replicas follow the archive alone until they restart knowing
        # where their new primary listens (after its start: same branch, in order).
        starts += [
            operations.Start(Action.APPLY_CONFIG, branch_id=branch.id, endpoint_id=e.id)
            for e in await tx.list_endpoints(project.id)
            if e.branch_id == branch.id and e.type == "read_only" and not e.disabled
        ]
    ops = await operations.start(tx, project_id=project.id, starts=starts) if starts else []
    return endpoint, ops


async def left_idle(tx: Tx, endpoint: Endpoint, now: int) -> Endpoint:
    """A new endpoint not started (its branch is not served yet): idle, nothing pending."""
    await tx.set_endpoint_state(
        endpoint_id=endpoint.id, current_state="idle", pending_state=None, now=now
    )
    return msgspec.structs.replace(endpoint, current_state="idle", pending_state=None)


async def list_(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str | None = None
) -> list[Endpoint]:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    if branch_id is not None:
        await access.branch(tx, project_id=project.id, branch_id=branch_id)
    found = await tx.list_endpoints(project.id)
    return [e for e in found if branch_id is None or e.branch_id == branch_id]


async def get(tx: Tx, *, account_id: str, project_id: str, endpoint_id: str) -> Endpoint:
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    return await access.endpoint(tx, project_id=project.id, endpoint_id=endpoint_id)


async def update(
    tx: Tx,
    *,
    account_id: str,
    project_id: str,
    endpoint_id: str,
    changes: EndpointChanges,
    settings: Settings,
    check_settings: compute_settings.SettingsCheck,
) -> tuple[Endpoint, list[Operation]]:
    """Resize, retune or disable; a running compute is restarted with its new settings (a
    larger one only within the account's compute units)."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    endpoint = await access.endpoint(tx, project_id=project.id, endpoint_id=endpoint_id)
    if changes.branch_id is not None and changes.branch_id != endpoint.branch_id:
        raise BadRequest("moving a compute to another branch is not supported")
    low, high = compute_settings.limits(
        endpoint.autoscaling_limit_min_cu
        if changes.autoscaling_limit_min_cu is None
        else compute_settings.cu(changes.autoscaling_limit_min_cu, "autoscaling_limit_min_cu"),
        endpoint.autoscaling_limit_max_cu
        if changes.autoscaling_limit_max_cu is None
        else compute_settings.cu(changes.autoscaling_limit_max_cu, "autoscaling_limit_max_cu"),
    )
    new_settings = dict(endpoint.settings)
    if changes.pg_settings is not None:
        checked = await compute_settings.checked_pg_settings(
            changes.pg_settings, pg_version=project.pg_version, check=check_settings
        )
        if checked:
            new_settings["pg_settings"] = checked
        else:
            new_settings.pop("pg_settings", None)
    updated = msgspec.structs.replace(
        endpoint,
        autoscaling_limit_min_cu=low,
        autoscaling_limit_max_cu=high,
        suspend_timeout_seconds=endpoint.suspend_timeout_seconds
        if changes.suspend_timeout_seconds is None
        else compute_settings.suspend_timeout(changes.suspend_timeout_seconds),
        settings=new_settings,
        disabled=endpoint.disabled if changes.disabled is None else changes.disabled,
        name=endpoint.name if changes.name is None else names.endpoint(changes.name),
        updated_at=clock.now_us(),
    )
    if high > endpoint.autoscaling_limit_max_cu and not updated.disabled:
        await quotas.check_computes(
            tx, account_id=project.account_id, settings=settings, resized=updated
        )
    starts = []
    if updated.disabled and not endpoint.disabled:
        starts.append(_suspend_op(updated))
        updated = msgspec.structs.replace(updated, pending_state="idle")
    elif (
        updated.autoscaling_limit_min_cu,
        updated.autoscaling_limit_max_cu,
        updated.settings,
    ) != (endpoint.autoscaling_limit_min_cu, endpoint.autoscaling_limit_max_cu, endpoint.settings):
        # apply_config restarts the compute with its new command line if it runs.
        starts.append(
            operations.Start(
                Action.APPLY_CONFIG, branch_id=endpoint.branch_id, endpoint_id=endpoint.id
            )
        )
    await tx.update_endpoint(updated)
    ops = await operations.start(tx, project_id=endpoint.project_id, starts=starts)
    return updated, ops


async def delete(
    tx: Tx, *, account_id: str, project_id: str, endpoint_id: str
) -> tuple[Endpoint, list[Operation]]:
    endpoint = await get(tx, account_id=account_id, project_id=project_id, endpoint_id=endpoint_id)
    branch = await tx.get_branch(project_id=endpoint.project_id, branch_id=endpoint.branch_id)
    if branch is not None:
        anonymized.refuse_rw_endpoint_delete(branch, endpoint.type)
    now = clock.now_us()
    await tx.delete_endpoint(endpoint_id=endpoint.id, now=now)
    ops = await operations.start(tx, project_id=endpoint.project_id, starts=[_suspend_op(endpoint)])
    return msgspec.structs.replace(endpoint, pending_state="idle", updated_at=now), ops


async def start(
    tx: Tx, *, account_id: str, project_id: str, endpoint_id: str, settings: Settings
) -> tuple[Endpoint, list[Operation]]:
    endpoint = await get(tx, account_id=account_id, project_id=project_id, endpoint_id=endpoint_id)
    if endpoint.disabled:
        raise Conflict("endpoint is disabled; enable it before starting it")
    if not anonymized.served(await tx.get_masking(endpoint.branch_id)):
        raise Locked(anonymized.unmasked(endpoint.branch_id))
    await quotas.check_computes(tx, account_id=account_id, settings=settings, starting=[endpoint])
    return await _transition(tx, endpoint, "active", [start_op(endpoint)])


async def suspend(
    tx: Tx, *, account_id: str, project_id: str, endpoint_id: str
) -> tuple[Endpoint, list[Operation]]:
    endpoint = await get(tx, account_id=account_id, project_id=project_id, endpoint_id=endpoint_id)
    return await _transition(tx, endpoint, "idle", [_suspend_op(endpoint)])


async def restart(
    tx: Tx, *, account_id: str, project_id: str, endpoint_id: str, settings: Settings
) -> tuple[Endpoint, list[Operation]]:
    endpoint = await get(tx, account_id=account_id, project_id=project_id, endpoint_id=endpoint_id)
    if endpoint.disabled:
        raise Conflict("endpoint is disabled; enable it before restarting it")
    # A suspended compute restarted is a start: it counts against the quotas as one.
    await quotas.check_computes(tx, account_id=account_id, settings=settings, starting=[endpoint])
    return await _transition(tx, endpoint, "active", [_suspend_op(endpoint), start_op(endpoint)])


async def _transition(
    tx: Tx, endpoint: Endpoint, pending: str, starts: list[operations.Start]
) -> tuple[Endpoint, list[Operation]]:
    updated = msgspec.structs.replace(endpoint, pending_state=pending, updated_at=clock.now_us())
    await tx.update_endpoint(updated)
    ops = await operations.start(tx, project_id=endpoint.project_id, starts=starts)
    return updated, ops


async def wake(tx: Tx, *, endpoint_id: str, settings: Settings) -> Operation:
    """The ``start_compute`` a connection waits for: the pending one if it is the endpoint's last
    operation, else a new one (which a detached project's ``tenant_reattach`` precedes), unless
    it would pass the account's quotas (LimitExceeded: nothing is queued).

    Not scoped to an account: the proxy knows only the endpoint (it has authenticated the role
    before asking).
    """
    endpoint = await tx.find_endpoint(endpoint_id)
    project = None if endpoint is None else await tx.get_project_by_id(endpoint.project_id)
    if endpoint is None or project is None or project.deleted_at is not None:
        raise NotFound(f"endpoint {endpoint_id} not found")
    if endpoint.disabled:
        raise Conflict(f"endpoint {endpoint_id} is disabled")
    if not anonymized.served(await tx.get_masking(endpoint.branch_id)):
        raise Locked(anonymized.unmasked(endpoint.branch_id))
    pending = [
        o
        for o in await tx.list_unsettled_operations(project_id=project.id)
        if o.endpoint_id == endpoint.id or o.branch_id is None
    ]
    if any(o.action is Action.SUSPEND_COMPUTE for o in pending):
        log.info(
            "endpoint %s: a connection arrived while its compute stops; it waits for the start"
            " queued behind the stop",
            endpoint.id,
        )
    if pending and pending[-1].action is Action.START_COMPUTE:
        return pending[-1]  # nothing after it can stop the compute again
    await quotas.check_computes(
        tx, account_id=project.account_id, settings=settings, starting=[endpoint]
    )
    if endpoint.pending_state is None:
        await tx.update_endpoint(
            msgspec.structs.replace(endpoint, pending_state="active", updated_at=clock.now_us())
        )
    ops = await operations.start(tx, project_id=project.id, starts=[start_op(endpoint)])
    return ops[-1]
