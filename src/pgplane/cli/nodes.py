"""``pgplane nodes``: the ``serve`` processes sharing the store, an operator's cordon, a drain
that moves a node's projects to others, and a dead node's projects brought back elsewhere."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgplane.cli.common import DataDir, in_store, on_store

if TYPE_CHECKING:
    from pgplane.store import Store, Tx

nodes_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="The nodes (serve processes) sharing the platform's store.",
    no_args_is_help=True,
)

_COLUMNS = ("name", "state", "heartbeat_age_s", "projects", "computes", "capacity", "api", "proxy")


@nodes_app.command("list")
def nodes_list(
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
    data_dir: DataDir = None,
) -> None:
    """Each node: its state (active, cordoned, draining, or down once its heartbeat lapsed),
    heartbeat age, projects placed on it, computes running there, and capacity."""
    from pgplane.core import clock  # noqa: PLC0415

    async def read(tx: Tx) -> list[dict[str, Any]]:
        now = clock.now_us()
        return [
            {
                "name": load.node.name,
                "state": load.node.observed_state(now),
                "heartbeat_age_s": round((now - load.node.heartbeat_at) / 1_000_000, 1),
                "projects": load.projects,
                "computes": load.computes,
                "capacity": load.node.capacity,
                "api": load.node.api_url,
                "proxy": load.node.proxy_address,
                # Nodes showing the same id share storage: projects move between them.
                "shared_storage": load.node.shared_storage,
            }
            for load in await tx.node_loads()
        ]

    rows = in_store(data_dir, read)
    if as_json:
        typer.echo(json.dumps({"nodes": rows}, indent=2))
        return
    table = [list(_COLUMNS), *([str(row[c]) for c in _COLUMNS] for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(_COLUMNS))]
    for line in table:
        typer.echo("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())


def _set_state(name: str, state: str, data_dir: DataDir) -> None:
    from pgplane.services import nodes  # noqa: PLC0415

    async def change(tx: Tx) -> str:
        return (await nodes.set_state(tx, name=name, state=state)).state

    typer.echo(json.dumps({"name": name, "state": in_store(data_dir, change)}))


@nodes_app.command("cordon")
def nodes_cordon(
    name: Annotated[str, typer.Argument(help="The node's name (see nodes list)")],
    data_dir: DataDir = None,
) -> None:
    """Give the node no new projects; those it has stay and keep working."""
    _set_state(name, "cordoned", data_dir)


@nodes_app.command("uncordon")
def nodes_uncordon(
    name: Annotated[str, typer.Argument(help="The node's name (see nodes list)")],
    data_dir: DataDir = None,
) -> None:
    """Let the node take new projects again."""
    _set_state(name, "active", data_dir)


@nodes_app.command("drain")
def nodes_drain(
    name: Annotated[str, typer.Argument(help="The node's name (see nodes list)")],
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="Wait until the node has no project left")
    ] = True,
    timeout: Annotated[float, typer.Option(help="Seconds to wait at most")] = 3600.0,
    data_dir: DataDir = None,
) -> None:
    """Move every project of the node to the other nodes on its shared storage, one at a time
    (its computes suspended, its data archived there and restored on the new node, checked by
    checksum; the computes that ran are started again), and give it no new projects. Prints a
    line per project moved; exits 1 when a project cannot move (the reason is printed)."""
    from pgplane.services import moves  # noqa: PLC0415

    async def drain(store: Store) -> int:
        from pgplane.core import clock  # noqa: PLC0415

        began = clock.now_us()
        async with store.write() as tx:
            node = await moves.begin_drain(tx, name=name, now=began)
            left = await _live_projects(tx, name)
        typer.echo(json.dumps({"name": name, "state": node.state, "projects": len(left)}))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        arriving: set[str] = set()  # placed elsewhere, its operations there not all settled
        broken: dict[str, str] = {}
        while wait and (left or arriving):
            await asyncio.sleep(0.5)
            async with store.read() as tx:
                now_left = await _live_projects(tx, name)
                arriving |= left - now_left
                for project_id in sorted(arriving):
                    if await tx.list_unsettled_operations(project_id=project_id):
                        continue
                    arriving.discard(project_id)
                    placed = await tx.project_node(project_id)
                    moved = {"project_id": project_id, "moved_to": placed and placed.name}
                    if error := await _failed(tx, project_id, began, "tenant_reattach"):
                        broken[project_id] = moved["error"] = error
                    typer.echo(json.dumps(moved))
                failed = {p: e for p in now_left if (e := await _failed(tx, p, began))}
            left = now_left
            if left and set(failed) == left and not arriving:
                for project_id, error in sorted(failed.items()):
                    typer.echo(json.dumps({"project_id": project_id, "error": error}))
                return 1
            if loop.time() > deadline:
                typer.echo(f"error: {len(left | arriving)} project(s) not moved yet", err=True)
                return 1
        if wait:
            typer.echo(json.dumps({"name": name, "state": node.state, "projects": 0}))
        return 1 if broken else 0

    code = on_store(data_dir, drain)
    if code:
        raise typer.Exit(code)


async def _live_projects(tx: Tx, node: str) -> set[str]:
    found = set()
    for project_id in await tx.node_project_ids(node):
        project = await tx.get_project_by_id(project_id)
        if project is not None and project.deleted_at is None:
            found.add(project_id)
    return found


async def _failed(tx: Tx, project_id: str, since: int, action: str = "tenant_detach") -> str | None:
    """The reason the project's latest ``action`` since ``since`` failed, if it did."""
    for op in await tx.list_operations(project_id=project_id, before=None, limit=50):
        if op.action == action and op.created_at >= since:
            return op.error if op.status == "failed" else None
    return None


@nodes_app.command("recover")
def nodes_recover(
    name: Annotated[str, typer.Argument(help="The dead node's name (see nodes list)")],
    to: Annotated[
        str | None,
        typer.Option(help="The node to bring them back on [the least loaded, project by project]"),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Bring a dead node's projects back on other nodes from shared storage: refused while the
    node's lease runs. Each is rebuilt from its cold archive, or from its branches' newest base
    state and their WAL shipped since (what the node had not shipped is lost); its unfinished
    operations fail, saying so, and are started again on the new node."""
    from pgplane.services import moves  # noqa: PLC0415

    async def recover(tx: Tx) -> list[dict[str, Any]]:
        done = await moves.recover(tx, dead=name, to=to)
        return [
            {"project_id": r.project_id, "node": r.node, "abandoned_operations": r.abandoned}
            for r in done
        ]

    typer.echo(json.dumps({"name": name, "projects": in_store(data_dir, recover)}, indent=2))
