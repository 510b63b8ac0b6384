"""Nodes: the ``serve`` processes sharing one store, and where a new project goes.

A node holds its name with a lease (``expires_at``) it renews with each heartbeat, as Patroni's
members hold their keys with a TTL: a node whose lease ran out is *down*, whatever state an
operator gave it. Only ``active`` nodes that are up take new projects.
"""

from __future__ import annotations

import hashlib
import re
import socket
from collections.abc import Sequence
from pathlib import Path

import msgspec

ACTIVE, CORDONED, DRAINING, DOWN = "active", "cordoned", "draining", "down"
SET_STATES = (ACTIVE, CORDONED, DRAINING)  # what an operator sets; "down" is observed

# A name is a label in logs, metrics and error messages: short, printable, no spaces.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class Node(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    instance: str  # the process holding the name now
    api_url: str
    proxy_address: str
    compute_host: str
    capacity: int  # computes it may run
    state: str  # one of SET_STATES
    started_at: int
    heartbeat_at: int
    expires_at: int  # its lease: down once this has passed
    # Where its node door listens (host:port), for other nodes only; "" while it has none (a
    # store of one node, or one starting).
    node_address: str = ""
    # The id of the shared storage it keeps the cold archive and history on (None: its own
    # disk only): projects move only between nodes that share one.
    shared_storage: str | None = None
    # The SHA-256 fingerprints (hex) of the certificates that open its door, newest first: those
    # it issued itself, the one before its latest renewal kept until its next look (a dial begun
    # with it may still be in its handshake). Empty while it has no door.
    door_certs: tuple[str, ...] = ()

    def up(self, now: int) -> bool:
        return self.expires_at >= now

    def observed_state(self, now: int) -> str:
        return self.state if self.up(now) else DOWN


class NodeLoad(msgspec.Struct, frozen=True, kw_only=True):
    """A node with what it holds, as ``nodes list`` shows it and placement weighs it."""

    node: Node
    projects: int  # live projects placed on it
    computes: int  # computes of those that run or are due to


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            "node name: 1 to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
    return name


def default_name(data_dir: Path) -> str:
    """The host's name and a hash of the data directory: stable across restarts, and distinct
    for two nodes on one host (each has a data directory of its own)."""
    digest = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:8]
    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:40].strip(".-") or "node"
    return f"{host}-{digest}"


def choose(
    loads: Sequence[NodeLoad], now: int, *, sharing: str | None = None, besides: str = ""
) -> Node | None:
    """The least loaded node that takes new projects: active and up, fewest live projects for
    its capacity (computes are started and suspended all day; projects stay), then fewest
    running computes, then by name so that the choice is the same on every node. With
    ``sharing``: only a node on that shared storage, other than ``besides`` (a project moving
    away from it)."""
    open_ = [
        load
        for load in loads
        if load.node.state == ACTIVE
        and load.node.up(now)
        and (sharing is None or (load.node.shared_storage == sharing and load.node.name != besides))
    ]
    if not open_:
        return None
    best = min(
        open_,
        key=lambda load: (
            load.projects / max(load.node.capacity, 1),
            load.computes / max(load.node.capacity, 1),
            load.node.name,
        ),
    )
    return best.node
