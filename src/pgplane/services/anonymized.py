"""Anonymized branches (Neon's ``branch_anonymized``, still beta there): a copy of a branch whose
masked columns hold made-up values in every row before any compute serves it.

The branch is created as any other (``create_branch`` copies its parent), marked anonymized,
with its masking rules (core/masking.py checks them). Its masking is an ``anonymize`` operation
(shown as Neon's ``apply_config``) that rewrites the masked columns in SQL the platform writes
(compute/local/masking.py), queued at creation with ``start_anonymization`` or later by ``POST
…/anonymize``. Until one run has completed, none of the branch's computes starts (the engine
refuses the start; a connection is told why), so no unmasked value of a masked column is ever
served from it.

What the branch's history holds from before its masking is the parent's data: it is never a
source. The branch cannot be restored (its computes would then serve its parent's data), its
past is not read (no child, snapshot or connection at a point of its history), and a child or
snapshot of its head waits for its masking. Its read-write compute cannot be deleted. These are
the ``restricted_actions`` it shows, in Neon's words where Neon has them.
"""

from __future__ import annotations

import msgspec

from pgplane.core import clock
from pgplane.core.masking import BadMasking, checked_rules
from pgplane.core.models import Branch, BranchMasking, Operation
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, NotFound
from pgplane.services import access, operations
from pgplane.store import Tx

# Neon's states; "initialized" is shown for "created" once the branch's data is built.
CREATED = "created"
ANONYMIZING = "anonymizing"
ANONYMIZED = "anonymized"
ERROR = "error"

RESTRICTED_ACTIONS = (
    (
        "restore",
        "an anonymized branch cannot be restored: its data would be its parent's, unmasked",
    ),
    (
        "delete-rw-endpoint",
        "the read-write compute of an anonymized branch cannot be deleted",
    ),
)


def rules(masking_rules: list[object]) -> list[dict[str, str]]:
    """The rules as kept, or a 400 naming the first that cannot apply."""
    try:
        return checked_rules(masking_rules)
    except BadMasking as exc:
        raise BadRequest(str(exc)) from None


def new(branch: Branch, masking_rules: list[dict[str, str]], now: int) -> BranchMasking:
    return BranchMasking(
        branch_id=branch.id,
        project_id=branch.project_id,
        masking_rules=masking_rules,
        state=CREATED,
        created_at=now,
        updated_at=now,
    )


def served(masking: BranchMasking | None) -> bool:
    """Whether the branch's computes may serve: it is not anonymized, or a masking completed."""
    return masking is None or masking.completed_at is not None


def unmasked(branch_id: str) -> str:
    """Why none of the branch's computes starts yet."""
    return (
        f"branch {branch_id} is anonymized and its masking has not completed (none of its"
        " computes runs before): POST …/anonymize, then connect once anonymized_status says"
        " anonymized"
    )


def shown_state(masking: BranchMasking, branch: Branch) -> str:
    if masking.state == CREATED and branch.current_state == "ready":
        return "initialized"
    return masking.state


async def status(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> tuple[BranchMasking, Branch]:
    """The account's anonymized branch and its masking (a 404 for any other branch)."""
    project = await access.live_project(tx, account_id=account_id, project_id=project_id)
    branch = await access.branch(tx, project_id=project.id, branch_id=branch_id)
    found = await tx.get_masking(branch.id)
    if found is None:
        raise NotFound(f"branch {branch.id} is not an anonymized branch")
    return found, branch


async def get_rules(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> list[dict[str, str]]:
    found, _ = await status(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    return found.masking_rules


async def set_rules(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str, masking_rules: list[object]
) -> list[dict[str, str]]:
    """Replace the whole list (as Neon's PATCH does); it applies at the next anonymization."""
    found, _ = await status(tx, account_id=account_id, project_id=project_id, branch_id=branch_id)
    kept = rules(masking_rules)
    if found.state == ANONYMIZING:
        raise Conflict(f"branch {branch_id} is being anonymized; change its rules once it is done")
    await tx.put_masking(
        msgspec.structs.replace(found, masking_rules=kept, updated_at=clock.now_us())
    )
    return kept


async def start(
    tx: Tx, *, account_id: str, project_id: str, branch_id: str
) -> tuple[BranchMasking, Branch, list[Operation]]:
    """Queue the branch's masking (its rules as they are now)."""
    found, branch = await status(
        tx, account_id=account_id, project_id=project_id, branch_id=branch_id
    )
    if found.state == ANONYMIZING:
        raise Conflict(f"branch {branch_id} is being anonymized already")
    started, ops = await queue(tx, found, branch)
    return started, branch, ops


async def queue(
    tx: Tx, masking: BranchMasking, branch: Branch
) -> tuple[BranchMasking, list[Operation]]:
    now = clock.now_us()
    started = msgspec.structs.replace(
        masking, state=ANONYMIZING, status_message=None, updated_at=now, failed_at=None
    )
    await tx.put_masking(started)
    ops = await operations.start(
        tx,
        project_id=branch.project_id,
        starts=[operations.Start(Action.ANONYMIZE, branch_id=branch.id)],
    )
    return started, ops


async def refuse_source(tx: Tx, branch: Branch, *, at_point: bool, what: str) -> None:
    """An anonymized branch is a source of data (a child, a snapshot, a restore, a read of its
    past) only at its head, once masked: anything else would serve its parent's values."""
    if not branch.anonymized:
        return
    if at_point:
        raise BadRequest(
            f"{what}: branch {branch.id} is anonymized, and its history before the masking"
            " holds unmasked data: only its head is a source"
        )
    if not served(await tx.get_masking(branch.id)):
        raise Conflict(f"{what}: {unmasked(branch.id)}")


def refuse_restore(branch: Branch) -> None:
    if branch.anonymized:
        raise Conflict(f"branch {branch.id}: {RESTRICTED_ACTIONS[0][1]}")


def refuse_rw_endpoint_delete(branch: Branch, endpoint_type: str) -> None:
    if branch.anonymized and endpoint_type == "read_write":
        raise Conflict(f"branch {branch.id}: {RESTRICTED_ACTIONS[1][1]}")
