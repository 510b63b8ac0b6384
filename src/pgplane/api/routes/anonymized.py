"""Anonymized branches (Neon's ``branch_anonymized``): create one, read and replace its masking
rules, start its masking, and follow it (services/anonymized.py)."""

from __future__ import annotations

import msgspec
from litestar import Controller, get, patch, post
from litestar.params import FromPath, JSONBody

from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import OptionalBody, error_responses
from pgplane.api.routes.branches import create_branch
from pgplane.api.schemas import BranchCreated, BranchCreateRequest
from pgplane.api.schemas.anonymized import (
    AnonymizationRun,
    AnonymizedBranchStatus,
    BranchAnonymizedCreateRequest,
    MaskingRulesResponse,
    MaskingRulesUpdateRequest,
)
from pgplane.core.clock import format_s
from pgplane.core.models import Branch, BranchMasking
from pgplane.services import anonymized


def _status(m: BranchMasking, branch: Branch) -> AnonymizedBranchStatus:
    def at(us: int | None) -> str | None:
        return None if us is None else format_s(us)

    ran = m.started_at is not None or m.completed_at is not None
    return AnonymizedBranchStatus(
        project_id=m.project_id,
        branch_id=m.branch_id,
        state=anonymized.shown_state(m, branch),
        status_message=m.status_message,
        created_at=format_s(m.created_at),
        updated_at=format_s(m.updated_at),
        failed_at=at(m.failed_at),
        last_run=AnonymizationRun(
            started_at=at(m.started_at),
            completed_at=at(m.completed_at),
            masked_columns=m.masked_columns,
        )
        if ran
        else None,
    )


class Anonymized(Controller):
    path = "/projects/{project_id:str}"
    tags = ["Branch"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @post(
        "/branch_anonymized",
        status_code=201,
        operation_id="createProjectBranchAnonymized",
        responses=error_responses(409, 422, body=True),
        operation_class=OptionalBody,
    )
    async def create(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        data: JSONBody[BranchAnonymizedCreateRequest | None] = None,
    ) -> BranchCreated:
        """A branch whose masked columns hold made-up values before any compute serves it."""
        ctx = authorized(request)
        body = data or BranchAnonymizedCreateRequest()
        rules = anonymized.rules([msgspec.to_builtins(r) for r in body.masking_rules or []])
        branch = body.branch_create or BranchCreateRequest()
        if body.annotation_value is not None:
            branch = msgspec.structs.replace(branch, annotation_value=body.annotation_value)
        return await create_branch(
            ctx, project_id, branch, masking=rules, anonymize=body.start_anonymization
        )

    @get(
        "/branches/{branch_id:str}/masking_rules",
        operation_id="getMaskingRules",
        responses=error_responses(),
    )
    async def rules(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> MaskingRulesResponse:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            found = await anonymized.get_rules(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return MaskingRulesResponse(masking_rules=found)

    @patch(
        "/branches/{branch_id:str}/masking_rules",
        operation_id="updateMaskingRules",
        responses=error_responses(409, body=True),
    )
    async def set_rules(
        self,
        request: AnyRequest,
        project_id: FromPath[str],
        branch_id: FromPath[str],
        data: JSONBody[MaskingRulesUpdateRequest],
    ) -> MaskingRulesResponse:
        """Replace the whole list; it applies at the next masking."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            kept = await anonymized.set_rules(
                tx,
                account_id=ctx.account_id,
                project_id=project_id,
                branch_id=branch_id,
                masking_rules=[msgspec.to_builtins(r) for r in data.masking_rules],
            )
        return MaskingRulesResponse(masking_rules=kept)

    @post(
        "/branches/{branch_id:str}/anonymize",
        status_code=200,
        operation_id="startAnonymization",
        responses=error_responses(409),
        operation_class=OptionalBody,
    )
    async def start(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> AnonymizedBranchStatus:
        """Mask the branch with its rules as they are now (an operation; follow
        anonymized_status)."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            masking, branch, _ = await anonymized.start(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        ctx.notify()
        return _status(masking, branch)

    @get(
        "/branches/{branch_id:str}/anonymized_status",
        operation_id="getAnonymizedBranchStatus",
        responses=error_responses(),
    )
    async def status(
        self, request: AnyRequest, project_id: FromPath[str], branch_id: FromPath[str]
    ) -> AnonymizedBranchStatus:
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            masking, branch = await anonymized.status(
                tx, account_id=ctx.account_id, project_id=project_id, branch_id=branch_id
            )
        return _status(masking, branch)
