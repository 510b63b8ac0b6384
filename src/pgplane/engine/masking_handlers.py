"""An anonymized branch's masking (services/anonymized.py): its ``anonymize`` operation, and
what one that failed for good leaves said."""

from __future__ import annotations

import msgspec

from pgplane.compute.driver import ColumnMask
from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.engine.context import Context, OnFinish, PermanentError, branch_at_work
from pgplane.services import anonymized
from pgplane.store import Tx


async def anonymize(ctx: Context, op: Operation) -> OnFinish | None:
    found = await branch_at_work(ctx, op)
    if found is None:
        return None  # deleted since
    project, branch = found
    async with ctx.store.read() as tx:
        masking = await tx.get_masking(branch.id)
    if masking is None:
        raise PermanentError(f"branch {branch.id} is not an anonymized branch")
    masks = [
        ColumnMask(
            database=r["database_name"],
            schema=r["schema_name"],
            table=r["table_name"],
            column=r["column_name"],
            function=r.get("masking_function"),
            value=r.get("masking_value"),
        )
        for r in masking.masking_rules
    ]
    started = clock.now_us()
    # No compute is named: the masking runs on the one serving the branch if any runs (it
    # served masked data already), else on a temporary postmaster no client reaches.
    masked = await ctx.driver.anonymize(
        project_id=project.id,
        branch_id=branch.id,
        pg_version=project.pg_version,
        compute=None,
        masks=masks,
    )

    async def done(tx: Tx) -> None:
        current = await tx.get_masking(branch.id)
        if current is None:
            return
        now = clock.now_us()
        tables = len({(m.database, m.schema, m.table) for m in masks})
        await tx.put_masking(
            msgspec.structs.replace(
                current,
                state=anonymized.ANONYMIZED,
                status_message=f"Anonymized {masked} columns in {tables} tables",
                masked_columns=masked,
                started_at=started,
                completed_at=now,
                failed_at=None,
                updated_at=now,
            )
        )

    return done


async def anonymize_given_up(tx: Tx, op: Operation) -> None:
    """The masking failed for good: the branch says why (its computes still do not start, unless
    an earlier masking completed)."""
    if op.branch_id is None:
        return
    current = await tx.get_masking(op.branch_id)
    if current is None:
        return
    now = clock.now_us()
    await tx.put_masking(
        msgspec.structs.replace(
            current,
            state=anonymized.ERROR,
            status_message=op.error or "the masking failed",
            failed_at=now,
            updated_at=now,
        )
    )
