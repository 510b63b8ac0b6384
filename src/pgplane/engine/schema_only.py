"""``create_branch`` of a schema-only branch (Neon's ``init_source: schema-only``).

The branch is a root of its own history, built from its source's schema and roles: the
operation names the source (``source_branch_id``, so it runs after the source's earlier work
and before its later work, a deletion included) and the point, if any. The branch's roles and
databases in the store (its parent's, now) that the source lacked at the point are made too;
the verifiers its login roles hold, carried over from the source, are what the proxy
authenticates them with.
"""

from __future__ import annotations

from pgplane.compute.driver import DatabaseSpec
from pgplane.core import clock
from pgplane.core.models import Branch, Operation, Project
from pgplane.engine.context import Context, OnFinish, PermanentError, role_specs
from pgplane.engine.history_handlers import point_of
from pgplane.store import Tx


async def create_schema_only(
    ctx: Context, op: Operation, project: Project, branch: Branch
) -> OnFinish | None:
    source_id = op.source_branch_id
    if source_id is None:
        raise PermanentError(f"branch {branch.id} has no source to copy the schema of")
    async with ctx.store.read() as tx:
        roles = await tx.list_roles(branch.id)
        databases = await tx.list_databases(branch.id)
    verifiers = await ctx.driver.create_schema_only_branch(
        project_id=project.id,
        source_branch_id=source_id,
        branch_id=branch.id,
        pg_version=project.pg_version,
        point=point_of(op),
        max_bytes=ctx.settings.schema_max_bytes,
        roles=role_specs(project, roles),
        databases=[DatabaseSpec(name=d.name, owner_name=d.owner_name) for d in databases],
    )

    async def ready(tx: Tx) -> None:
        await tx.set_branch_state(
            branch_id=branch.id, current_state="ready", pending_state=None, now=clock.now_us()
        )
        await tx.set_role_verifiers(branch_id=branch.id, verifiers=verifiers)

    return ready
