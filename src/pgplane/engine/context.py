"""What every handler is given and shares: the context, the outcome type, common look-ups."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from pgplane.compute.driver import ComputeDriver, ComputeSpec, RoleSpec
from pgplane.config import Settings
from pgplane.core.models import Branch, Endpoint, Operation, Project, Role
from pgplane.services import project_settings
from pgplane.store import Store, Tx

OnFinish = Callable[[Tx], Awaitable[None]]


class PermanentError(Exception):
    """Retrying cannot help (the operation's object is gone or the action is unknown)."""


@dataclass(frozen=True, slots=True)
class Context:
    store: Store
    driver: ComputeDriver
    settings: Settings


Handler = Callable[[Context, Operation], Awaitable[OnFinish | None]]


async def project_of(ctx: Context, op: Operation) -> Project:
    async with ctx.store.read() as tx:
        project = await tx.get_project_by_id(op.project_id)
    if project is None:
        raise PermanentError(f"project {op.project_id} does not exist")
    return project


def require_branch(op: Operation) -> str:
    if op.branch_id is None:
        raise PermanentError(f"{op.action} needs a branch")
    return op.branch_id


async def branch_at_work(ctx: Context, op: Operation) -> tuple[Project, Branch] | None:
    """The live project and the branch whose data the operation makes or replaces; None when
    either was deleted meanwhile (delete_timeline removes whatever was built)."""
    project = await project_of(ctx, op)
    branch_id = require_branch(op)
    if project.deleted_at is not None:
        return None
    async with ctx.store.read() as tx:
        branch = await tx.get_branch(project_id=project.id, branch_id=branch_id)
    return None if branch is None else (project, branch)


def role_specs(project: Project, roles: Sequence[Role]) -> list[RoleSpec]:
    """The branch's roles as the driver applies them; with logical replication on, they may
    replicate (Neon's roles may: its neon_superuser has REPLICATION)."""
    replication = project_settings.logical_replication(project.settings)
    return [
        RoleSpec(name=r.name, password=r.password, login=r.login, replication=replication)
        for r in roles
    ]


def compute_spec(
    project: Project, endpoint: Endpoint, primary: Endpoint | None = None
) -> ComputeSpec:
    """The driver's view of an endpoint; ``primary``: a read-only one's branch's read-write
    compute, which it follows."""
    return ComputeSpec(
        read_only=endpoint.type == "read_only",
        primary_port=primary.port if primary is not None and endpoint.type == "read_only" else None,
        project_id=project.id,
        branch_id=endpoint.branch_id,
        endpoint_id=endpoint.id,
        pg_version=project.pg_version,
        port=endpoint.port,
        pg_settings={k: str(v) for k, v in endpoint.settings.get("pg_settings", {}).items()},
        autoscaling_limit_min_cu=endpoint.autoscaling_limit_min_cu,
        autoscaling_limit_max_cu=endpoint.autoscaling_limit_max_cu,
        logical_replication=project_settings.logical_replication(project.settings),
    )
