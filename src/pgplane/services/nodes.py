"""Nodes: registration and heartbeats, placement of new projects, and the refusal of data-plane
work for a project whose node is down.

Every rule that needs several nodes to agree is decided in the store, inside one transaction:
a new project's node is chosen in the transaction that creates it (write transactions are
serialized, so two creations see each other's placement), and a node's lease is renewed only
by the process that holds its name.
"""

from __future__ import annotations

import logging

from pgplane.core import clock
from pgplane.core.nodes import CORDONED, DOWN, SET_STATES, Node, NodeLoad, choose
from pgplane.errors import BadRequest, NotFound, Unavailable
from pgplane.nodelink.authority import NodeAuthority
from pgplane.store import Tx

log = logging.getLogger(__name__)

# How soon a client may try again: about a heartbeat, when a node that was away may be back.
_RETRY_AFTER = "5"


class NameTaken(Exception):
    """Another live process holds the node's name."""


async def register(tx: Tx, node: Node) -> int:
    """Put the node in the store, or take its name back after a restart; refused while a process
    of another data directory holds the name with a lease still running (one of the same
    directory is gone: the directory's server lock says so). Returns how many projects it
    adopted: an earlier store's (no node), or its own data directory's under an earlier name."""
    current = await tx.get_node(node.name)
    if (
        current is not None
        and home_of(current.instance) != home_of(node.instance)
        and current.up(node.started_at)
    ):
        raise NameTaken(
            f"node {node.name!r} is held by another running pgplane (heartbeat"
            f" {clock.format_s(current.heartbeat_at)}); give this one another --node-name"
        )
    await tx.put_node(node)
    adopted = await tx.adopt_projects(node.name)
    # The same data directory under another name before (the host renamed, as a container's
    # is at each start, or --node-name changed): its projects are this node's, their data is
    # here. The directory's server lock says no other process runs on it.
    for load in await tx.node_loads():
        old = load.node
        if old.name != node.name and home_of(old.instance) == home_of(node.instance):
            moved = await tx.move_projects(from_node=old.name, to_node=node.name)
            await tx.delete_node(old.name)
            log.info(
                "node %s was named %s before: its %d project(s) kept", node.name, old.name, moved
            )
            adopted += moved
    return adopted


def home_of(instance: str) -> str:
    """The data directory's part of an instance (``home.process``)."""
    return instance.split(".", 1)[0]


async def place(tx: Tx, *, project_id: str, now: int) -> Node | None:
    """Place a new project on the least loaded node that takes projects; None when no node is
    registered at all (the store used without ``serve``: the first node adopts it)."""
    loads = await tx.node_loads()
    if not loads:
        return None
    chosen = choose(loads, now)
    if chosen is None:
        raise Unavailable(
            f"no node takes new projects now ({_states(loads, now)}); retry shortly",
            headers={"Retry-After": _RETRY_AFTER},
        )
    await tx.place_project(project_id=project_id, node=chosen.name)
    return chosen


def _states(loads: list[NodeLoad], now: int) -> str:
    return ", ".join(f"{load.node.name}: {load.node.observed_state(now)}" for load in loads)


async def require_up(tx: Tx, project_id: str, *, now: int | None = None) -> None:
    """Refuse data-plane work on a project whose node is down: its computes and data are there,
    and nothing else may touch them. Retryable: the node may come back."""
    node = await tx.project_node(project_id)
    now = clock.now_us() if now is None else now
    if node is None or node.up(now):
        return
    raise Unavailable(
        f"{down(node, now)}; its data-plane work waits for it to return; retry later",
        headers={"Retry-After": _RETRY_AFTER},
    )


def down(node: Node, now: int) -> str:
    """What to say of a project whose node is down."""
    away = (now - node.heartbeat_at) // 1_000_000
    return f"the project's node {node.name} is down (no heartbeat for {away} s)"


async def set_state(tx: Tx, *, name: str, state: str) -> Node:
    """An operator's state for a node (cordon: no new projects; uncordon: active again)."""
    if state not in SET_STATES or state == DOWN:
        raise BadRequest(f"node state: one of {', '.join(SET_STATES)}")
    if not await tx.set_node_state(name=name, state=state):
        raise NotFound(f"no node named {name!r}")
    node = await tx.get_node(name)
    assert node is not None  # noqa: S101 - set in this transaction
    if state == CORDONED:
        log.info("node %s cordoned: it gets no new projects", name)
    return node


async def authority(tx: Tx) -> NodeAuthority:
    """The platform's node authority (:mod:`pgplane.nodelink`), made in this write transaction
    when there is none yet: nodes starting together make one between them, as writers are
    serialized and the second finds the first's."""
    found = await tx.get_node_authority()
    if found is not None:
        return NodeAuthority.from_pem(*found)
    made = NodeAuthority.create()
    await tx.put_node_authority(cert=made.cert_pem(), key=made.key_pem(), now=clock.now_us())
    log.info("the platform's node authority was made: nodes reach each other with its certificates")
    return made
