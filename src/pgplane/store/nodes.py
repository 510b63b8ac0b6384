"""The node side of the store contract: the ``serve`` processes sharing the store, and which of
them each project is placed on.

Part of :class:`pgplane.store.base.Tx`: nothing commits on its own. A node's name is unique
(its row's key); which process holds it is the row's ``instance``, renewed only by that
process (a compare-and-set on the instance), so a name two processes were given by mistake
is never held by both at once.
"""

from __future__ import annotations

import abc

from pgplane.core.nodes import Node, NodeLoad


class NodesTx(abc.ABC):
    @abc.abstractmethod
    async def get_node(self, name: str) -> Node | None: ...

    @abc.abstractmethod
    async def put_node(self, node: Node) -> None:
        """Insert the node, or replace every field of the one of that name but its state (an
        operator's cordon outlives a restart)."""

    @abc.abstractmethod
    async def renew_node(self, *, name: str, instance: str, now: int, expires_at: int) -> bool:
        """Move the node's heartbeat and lease forward if ``instance`` still holds the name."""

    @abc.abstractmethod
    async def set_node_door_certs(self, *, name: str, instance: str, certs: list[str]) -> bool:
        """The certificates that open the node's door (:attr:`Node.door_certs`), if
        ``instance`` still holds the name."""

    @abc.abstractmethod
    async def set_node_state(self, *, name: str, state: str) -> bool:
        """An operator's state (active, cordoned, draining); False if no such node."""

    @abc.abstractmethod
    async def node_loads(self) -> list[NodeLoad]:
        """Every node, by name, with its live projects and the computes they run or will."""

    @abc.abstractmethod
    async def adopt_projects(self, node: str) -> int:
        """Place every project that has no node (an earlier store's) on ``node``."""

    @abc.abstractmethod
    async def move_projects(self, *, from_node: str, to_node: str) -> int:
        """Place every project of ``from_node`` on ``to_node`` (a node renamed)."""

    @abc.abstractmethod
    async def delete_node(self, name: str) -> None: ...

    @abc.abstractmethod
    async def place_project(self, *, project_id: str, node: str) -> None: ...

    @abc.abstractmethod
    async def project_node(self, project_id: str) -> Node | None:
        """The node the project is placed on (None: not placed, or its node is gone)."""

    @abc.abstractmethod
    async def node_project_ids(self, node: str) -> set[str]:
        """The projects placed on the node, deleted ones included (their deletions run
        there)."""

    @abc.abstractmethod
    async def get_platform_id(self) -> str | None:
        """The platform's own id, if made yet (the owner an object store's prefix records)."""

    @abc.abstractmethod
    async def put_platform_id(self, *, platform_id: str, now: int) -> None:
        """Record the platform's id; there is one (a second insert fails the transaction)."""

    @abc.abstractmethod
    async def get_node_authority(self) -> tuple[str, str] | None:
        """The platform's node authority (its certificate and key, PEM), if made yet."""

    @abc.abstractmethod
    async def put_node_authority(self, *, cert: str, key: str, now: int) -> None:
        """Record the node authority; there is one (a second insert fails the transaction)."""

    @abc.abstractmethod
    async def get_proxy_authority(self) -> tuple[str, str] | None:
        """The platform's tenant-facing authority (its certificate and key, PEM), if made yet:
        the one every node's proxy certificates are signed by, on a store of several nodes."""

    @abc.abstractmethod
    async def put_proxy_authority(self, *, cert: str, key: str, now: int) -> None:
        """Record the tenant-facing authority, replacing the one there was (there is one)."""
