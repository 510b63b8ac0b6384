"""``pgplane backups``: what the object store holds, checked (objectstore/verify.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from pgplane.cli.common import DataDir, on_store
from pgplane.cli.recover import ArchiveKeyOption, ObjectStoreOption, with_object_store

if TYPE_CHECKING:
    from pgplane.store import Store

backups_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="The platform's backups in its object store.",
    no_args_is_help=True,
)


@backups_app.command("verify")
def backups_verify(
    project: Annotated[
        str | None, typer.Option(help="Only this project's branches [every project's]")
    ] = None,
    data_dir: DataDir = None,
    object_store: ObjectStoreOption = None,
    archive_key_file: ArchiveKeyOption = None,
) -> None:
    """Restore each branch's newest base state and WAL from the object store into a scratch
    directory (beside a running serve), replayed to the end and checked by checksum, then
    removed; nothing is written to the object store. Prints a line per branch (the time it is
    restorable to, or why not); exits 1 if any branch could not be restored."""
    from pgplane.compute.driver import ComputeError  # noqa: PLC0415
    from pgplane.objectstore.verify import verify  # noqa: PLC0415

    settings = with_object_store(data_dir, object_store, archive_key_file)

    async def check(store: Store) -> list[dict[str, object]]:
        return await verify(settings, store, project_ids=None if project is None else [project])

    try:
        rows = on_store(data_dir, check)
    except ComputeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if project is not None and not rows:
        typer.echo(f"error: no project {project} with a branch to verify", err=True)
        raise typer.Exit(2)
    typer.echo(json.dumps({"branches": rows}, indent=2))
    if any(row["error"] for row in rows):
        raise typer.Exit(1)
