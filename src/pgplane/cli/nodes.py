"""``pgplane nodes``: the ``serve`` processes sharing the store, and an operator's cordon."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from pgplane.cli.common import DataDir, in_store

if TYPE_CHECKING:
    from pgplane.store import Tx

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
