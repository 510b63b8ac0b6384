"""``/projects/{project_id}/branches/{branch_id}/schema`` and ``…/compare_schema``: a branch's
schema as SQL, and the diff of two branches' (services/schemas.py says how each is read)."""

from __future__ import annotations

from litestar import Controller, get
from litestar.params import FromPath, Parameter

from pgplane.api.auth import AnyRequest, Authorized, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import BranchSchemaCompareResponse, BranchSchemaResponse
from pgplane.services import history, schemas

_TEXT = Parameter(default=None, max_length=256)
# Neon's, not served yet: read only to be refused with a 400 that names them (never ignored),
# and left out of the document, which says what the platform serves.
_REFUSED = Parameter(default=None, max_length=256, include_in_schema=False)
# A point of the branch's history: services/history.py checks it with messages that name the
# parameter; the patterns only document the same (as on a branch's parent_lsn).
_LSN = Parameter(default=None, max_length=64, schema_extra={"pattern": history.LSN_PATTERN})
_TIME = Parameter(
    default=None,
    max_length=64,
    schema_extra={"format": "date-time", "pattern": history.TIME_PATTERN},
)


class BranchSchemas(Controller):
    path = "/projects/{project_id:str}/branches/{branch_id:str}"
    tags = ["Branch"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @get("/schema", operation_id="getProjectBranchSchema", responses=error_responses(409, 422))
    async def schema(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        db_name: str | None = Parameter(default=None, max_length=256),
        lsn: str | None = _LSN,
        timestamp: str | None = _TIME,
        format: str | None = _REFUSED,
    ) -> BranchSchemaResponse:
        """The database's schema, as ``pg_dump --schema-only`` prints it; at its head, or as it
        was at ``lsn`` or ``timestamp`` of the branch's history."""
        at = schemas.point(lsn, timestamp)
        schemas.check_format(format)
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await schemas.target(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                db_name=db_name,
            )
        return BranchSchemaResponse(sql=await _read(ctx, found, at))

    @get(
        "/compare_schema",
        operation_id="getProjectBranchSchemaComparison",
        responses=error_responses(409, 422),
    )
    async def compare_schema(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        db_name: str | None = Parameter(default=None, max_length=256),
        base_branch_id: str | None = _TEXT,
        lsn: str | None = _LSN,
        timestamp: str | None = _TIME,
        base_lsn: str | None = _LSN,
        base_timestamp: str | None = _TIME,
    ) -> BranchSchemaCompareResponse:
        """The unified diff from the base branch's schema (its parent's by default) to this
        branch's; empty when they agree. Each at its head, or at a point of its history."""
        at = schemas.point(lsn, timestamp)
        base_at = schemas.point(base_lsn, base_timestamp, prefix="base_")
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await schemas.target(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                db_name=db_name,
            )
            base_found = await schemas.base_target(
                tx, account_id=ctx.account_id, found=found, base_branch_id=base_branch_id
            )
        sql, base_sql = await _read(ctx, found, at), await _read(ctx, base_found, base_at)
        return BranchSchemaCompareResponse(
            diff=schemas.diff(
                base_sql, sql, db_name=found.db_name, base=base_found.branch, branch=found.branch
            )
        )


async def _read(ctx: Authorized, found: schemas.Target, at: history.NamedPoint | None) -> str:
    return await schemas.read(
        ctx.schema, found, max_bytes=ctx.settings.schema_max_bytes, at=at, lookup=ctx.history
    )
