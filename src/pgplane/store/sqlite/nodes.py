"""Nodes and where projects are placed (both backends)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgplane.core.nodes import Node, NodeLoad
from pgplane.store.sqlite.common import Statements

_COLUMNS = (
    "n.name, n.instance, n.api_url, n.proxy_address, n.compute_host, n.capacity, n.state,"
    " n.started_at, n.heartbeat_at, n.expires_at, n.node_address, n.shared_storage,"
    " n.door_certs"
)
# A compute counts while it runs or is due to (as the account quota counts them).
_LOADS = (
    f"SELECT {_COLUMNS},"
    " (SELECT COUNT(*) FROM projects p WHERE p.node = n.name AND p.deleted_at IS NULL),"
    " (SELECT COUNT(*) FROM endpoints e JOIN projects p ON p.id = e.project_id"
    "  WHERE p.node = n.name AND p.deleted_at IS NULL AND e.deleted_at IS NULL"
    "  AND (e.current_state = 'active' OR e.pending_state = 'active'))"
    " FROM nodes n ORDER BY n.name"
)


def _node(r: Sequence[Any]) -> Node:
    return Node(
        name=r[0],
        instance=r[1],
        api_url=r[2],
        proxy_address=r[3],
        compute_host=r[4],
        capacity=r[5],
        state=r[6],
        started_at=r[7],
        heartbeat_at=r[8],
        expires_at=r[9],
        node_address=r[10],
        shared_storage=r[11],
        door_certs=tuple(r[12].split()),
    )


class NodesMixin(Statements):
    """The node part of :class:`pgplane.store.base.Tx`."""

    async def get_node(self, name: str) -> Node | None:
        r = await self._c.one(f"SELECT {_COLUMNS} FROM nodes n WHERE n.name = ?", (name,))
        return _node(r) if r else None

    async def put_node(self, node: Node) -> None:
        n = node
        await self._c.execute(
            "INSERT INTO nodes (name, instance, api_url, proxy_address, compute_host, capacity,"
            " state, started_at, heartbeat_at, expires_at, node_address, shared_storage,"
            " door_certs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (name) DO UPDATE SET instance = excluded.instance,"
            " shared_storage = excluded.shared_storage,"
            " api_url = excluded.api_url, proxy_address = excluded.proxy_address,"
            " node_address = excluded.node_address, door_certs = excluded.door_certs,"
            " compute_host = excluded.compute_host, capacity = excluded.capacity,"
            " started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,"
            " expires_at = excluded.expires_at",
            (
                n.name,
                n.instance,
                n.api_url,
                n.proxy_address,
                n.compute_host,
                n.capacity,
                n.state,
                n.started_at,
                n.heartbeat_at,
                n.expires_at,
                n.node_address,
                n.shared_storage,
                " ".join(n.door_certs),
            ),
        )

    async def renew_node(self, *, name: str, instance: str, now: int, expires_at: int) -> bool:
        cur = await self._c.execute(
            "UPDATE nodes SET heartbeat_at = ?, expires_at = ? WHERE name = ? AND instance = ?",
            (now, expires_at, name, instance),
        )
        return cur.rowcount == 1

    async def set_node_door_certs(self, *, name: str, instance: str, certs: list[str]) -> bool:
        cur = await self._c.execute(
            "UPDATE nodes SET door_certs = ? WHERE name = ? AND instance = ?",
            (" ".join(certs), name, instance),
        )
        return cur.rowcount == 1

    async def set_node_state(self, *, name: str, state: str) -> bool:
        cur = await self._c.execute("UPDATE nodes SET state = ? WHERE name = ?", (state, name))
        return cur.rowcount == 1

    async def node_loads(self) -> list[NodeLoad]:
        rows = await self._c.all(_LOADS)
        return [NodeLoad(node=_node(r), projects=r[13], computes=r[14]) for r in rows]

    async def adopt_projects(self, node: str) -> int:
        cur = await self._c.execute("UPDATE projects SET node = ? WHERE node IS NULL", (node,))
        return cur.rowcount

    async def move_projects(self, *, from_node: str, to_node: str) -> int:
        cur = await self._c.execute(
            "UPDATE projects SET node = ? WHERE node = ?", (to_node, from_node)
        )
        return cur.rowcount

    async def delete_node(self, name: str) -> None:
        await self._c.execute("DELETE FROM nodes WHERE name = ?", (name,))

    async def place_project(self, *, project_id: str, node: str) -> None:
        await self._c.execute("UPDATE projects SET node = ? WHERE id = ?", (node, project_id))

    async def project_node(self, project_id: str) -> Node | None:
        r = await self._c.one(
            f"SELECT {_COLUMNS} FROM projects p JOIN nodes n ON n.name = p.node WHERE p.id = ?",
            (project_id,),
        )
        return _node(r) if r else None

    async def node_project_ids(self, node: str) -> set[str]:
        rows = await self._c.all("SELECT id FROM projects WHERE node = ?", (node,))
        return {r[0] for r in rows}

    async def get_platform_id(self) -> str | None:
        r = await self._c.one("SELECT platform_id FROM platform WHERE id = 1")
        return str(r[0]) if r else None

    async def put_platform_id(self, *, platform_id: str, now: int) -> None:
        await self._c.execute(
            "INSERT INTO platform (id, platform_id, created_at) VALUES (1, ?, ?)",
            (platform_id, now),
        )

    async def get_node_authority(self) -> tuple[str, str] | None:
        r = await self._c.one("SELECT cert, key FROM node_authority WHERE id = 1")
        return (r[0], r[1]) if r else None

    async def put_node_authority(self, *, cert: str, key: str, now: int) -> None:
        await self._c.execute(
            "INSERT INTO node_authority (id, cert, key, created_at) VALUES (1, ?, ?, ?)",
            (cert, key, now),
        )

    async def get_proxy_authority(self) -> tuple[str, str] | None:
        r = await self._c.one("SELECT cert, key FROM proxy_authority WHERE id = 1")
        return (r[0], r[1]) if r else None

    async def put_proxy_authority(self, *, cert: str, key: str, now: int) -> None:
        await self._c.execute(
            "INSERT INTO proxy_authority (id, cert, key, created_at) VALUES (1, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET cert = excluded.cert, key = excluded.key,"
            " created_at = excluded.created_at",
            (cert, key, now),
        )
