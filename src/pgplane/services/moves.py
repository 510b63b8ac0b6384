"""Projects moving between nodes through shared storage: a node drained, a dead node's projects
brought back elsewhere.

A move is operations of the project, as every change of its data is: its running computes
suspended, ``tenant_detach`` on its node (its tree archived on shared storage, checksummed), then
``tenant_reattach`` and the computes started again, which run wherever the project is placed by
then. The placement changes in the transaction that finishes the detach (``after_detach``): a
detached project of a draining node goes to the least loaded node on the same shared storage,
so no request in between can bring it back to the node it leaves, and a crash of either node
anywhere leaves operations that converge where the store says the project is.

A dead node's projects (``recover``) are placed on other nodes by an operator, once its lease
has run out: their unfinished operations end ``failed`` with the reason, are started again
after a ``tenant_attach`` that rebuilds the data on the new node from what was shipped (the
cold archive, or each branch's newest base state and WAL), and the computes that ran are
started again. Connection strings do not change: they name endpoints, not nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from pgplane.core import clock
from pgplane.core.models import Operation
from pgplane.core.nodes import CORDONED, DRAINING, Node, choose
from pgplane.core.operations import Action
from pgplane.errors import BadRequest, Conflict, NotFound, Unavailable
from pgplane.services import operations
from pgplane.services.operations import Start
from pgplane.store import Tx

log = logging.getLogger(__name__)

# Work a recovery starts anew rather than again: the attach brings the data itself, and the
# scheduler starts checks on its own.
_NOT_REDONE = frozenset(
    {
        Action.TENANT_ATTACH,
        Action.TENANT_DETACH,
        Action.TENANT_REATTACH,
        Action.CHECK_AVAILABILITY,
    }
)


@dataclass(frozen=True, slots=True)
class Recovered:
    project_id: str
    node: str
    abandoned: int  # unfinished operations of the dead node, failed and started again


async def _node(tx: Tx, name: str) -> Node:
    node = await tx.get_node(name)
    if node is None:
        raise NotFound(f"no node named {name!r}")
    return node


def _needs_shared(node: Node) -> str:
    if node.shared_storage is None:
        raise BadRequest(
            f"node {node.name} keeps its archive and history on its own disk (no --shared-dir):"
            " its projects cannot move"
        )
    return node.shared_storage


async def _target(tx: Tx, source: Node, now: int) -> Node | None:
    return choose(await tx.node_loads(), now, sharing=_needs_shared(source), besides=source.name)


async def begin_drain(tx: Tx, *, name: str, now: int | None = None) -> Node:
    """Mark the node draining (no new projects; its scheduler moves its projects one at a
    time); refused when there is nowhere for them to go."""
    now = clock.now_us() if now is None else now
    node = await _node(tx, name)
    if await _target(tx, node, now) is None:
        raise Unavailable(
            f"no other active node that is up shares node {name}'s storage: its projects have"
            " nowhere to go"
        )
    await tx.set_node_state(name=name, state=DRAINING)
    log.info("node %s draining: its projects move to other nodes", name)
    return await _node(tx, name)


async def start_move(tx: Tx, *, project_id: str, now: int | None = None) -> list[Operation]:
    """The operations that move one project of a draining node; none when it is busy, gone, or
    has nowhere to go (the scheduler looks again next tick)."""
    now = clock.now_us() if now is None else now
    project = await tx.get_project_by_id(project_id)
    node = await tx.project_node(project_id)
    if project is None or project.deleted_at is not None or node is None:
        return []
    if await tx.list_unsettled_operations(project_id=project_id):
        return []
    if await _target(tx, node, now) is None:
        return []
    if project.storage_state == "detached":  # its archive goes to shared storage, if not there
        return await operations.start(
            tx, project_id=project_id, starts=[Start(Action.TENANT_DETACH)]
        )
    running = [
        e
        for e in await tx.list_endpoints(project_id)
        if e.current_state == "active" and e.pending_state is None and not e.disabled
    ]
    for endpoint in running:
        await tx.update_endpoint(
            msgspec.structs.replace(endpoint, pending_state="idle", updated_at=now)
        )
    starts = [
        *(Start(Action.SUSPEND_COMPUTE, branch_id=e.branch_id, endpoint_id=e.id) for e in running),
        Start(Action.TENANT_DETACH),
        Start(Action.TENANT_REATTACH),
        # Running before, running after: a compute nobody suspends (-1) stays up, moved.
        *(Start(Action.START_COMPUTE, branch_id=e.branch_id, endpoint_id=e.id) for e in running),
    ]
    return await operations.start(tx, project_id=project_id, starts=starts)


async def after_detach(tx: Tx, *, project_id: str, now: int | None = None) -> str | None:
    """In the transaction that finishes a detach: a project of a draining node placed on
    another node of its shared storage (the name), or left where it is (None)."""
    node = await tx.project_node(project_id)
    if node is None or node.state != DRAINING or node.shared_storage is None:
        return None
    target = await _target(tx, node, clock.now_us() if now is None else now)
    if target is None:
        log.warning(
            "project %s detached on draining node %s: no node to take it", project_id, node.name
        )
        return None
    await tx.place_project(project_id=project_id, node=target.name)
    log.info("project %s moves from node %s to node %s", project_id, node.name, target.name)
    return target.name


async def recover(
    tx: Tx, *, dead: str, to: str | None = None, now: int | None = None
) -> list[Recovered]:
    """Every live project of the dead node placed on another node of its shared storage (``to``,
    or the least loaded each time) and rebuilt there; refused while its lease runs."""
    now = clock.now_us() if now is None else now
    node = await _node(tx, dead)
    shared = _needs_shared(node)
    if node.up(now):
        raise Conflict(
            f"node {dead} is up (heartbeat {clock.format_s(node.heartbeat_at)}, lease until"
            f" {clock.format_s(node.expires_at)}): drain it instead, or wait until it is down"
        )
    target = None
    if to is not None:
        target = await _node(tx, to)
        if target.name == dead or not target.up(now) or target.shared_storage != shared:
            raise BadRequest(
                f"node {to} cannot take node {dead}'s projects: it must be another node that is"
                " up, on the same shared storage"
            )
    # A node that returns takes no new projects until an operator says so.
    await tx.set_node_state(name=dead, state=CORDONED if node.state == CORDONED else DRAINING)
    done = []
    for project_id in sorted(await tx.node_project_ids(dead)):
        project = await tx.get_project_by_id(project_id)
        if project is None or project.deleted_at is not None:
            continue
        chosen = target or choose(await tx.node_loads(), now, sharing=shared, besides=dead)
        if chosen is None:
            raise Unavailable(f"no other active node that is up shares node {dead}'s storage")
        reason = (
            f"its node {dead} was lost before it finished; the project was brought back on node"
            f" {chosen.name} from shared storage, and this work started again there"
        )
        done.append(await bring_back(tx, project_id, to=chosen.name, reason=reason, now=now))
    return done


async def bring_back(tx: Tx, project_id: str, *, to: str, reason: str, now: int) -> Recovered:
    """The project's data rebuilt on node ``to`` from what was shipped (a ``tenant_attach``),
    its unfinished operations failed with ``reason`` and started again after it, and the
    computes that ran started again."""
    project = await tx.get_project_by_id(project_id)
    if project is None:
        raise NotFound(f"no project {project_id}")
    abandoned = await tx.list_unsettled_operations(project_id=project_id)
    for op in abandoned:
        await tx.abandon_operation(operation_id=op.id, error=reason, now=now)
    await tx.place_project(project_id=project_id, node=to)
    again = [
        Start(
            op.action,
            branch_id=op.branch_id,
            endpoint_id=op.endpoint_id,
            source_branch_id=op.source_branch_id,
            point_lsn=op.point_lsn,
            point_time=op.point_time,
            preserve_branch_id=op.preserve_branch_id,
            snapshot_id=op.snapshot_id,
        )
        for op in abandoned
        if op.action not in _NOT_REDONE
    ]
    starts: list[Start] = []
    if project.storage_state == "attached":
        await tx.set_project_storage(project_id=project_id, state="detached")
        starts.append(Start(Action.TENANT_ATTACH))
        redone = {s.endpoint_id for s in again if s.action is Action.START_COMPUTE}
        again += [
            Start(Action.START_COMPUTE, branch_id=e.branch_id, endpoint_id=e.id)
            for e in await tx.list_endpoints(project_id)
            if e.current_state == "active" and not e.disabled and e.id not in redone
        ]
    starts += again
    if starts:
        await operations.start(tx, project_id=project_id, starts=starts)
    log.info("project %s brought back on node %s", project_id, to)
    return Recovered(project_id=project_id, node=to, abandoned=len(abandoned))
