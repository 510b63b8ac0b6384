"""``pgplane store``: the platform's store, moved from SQLite to PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from pgplane.cli.common import DataDir
from pgplane.config import settings_from_env

store_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="The platform's store: SQLite in the data directory, or PostgreSQL (--store).",
    no_args_is_help=True,
)


@store_app.command("copy")
def store_copy(
    target: Annotated[
        str, typer.Option("--to", help="postgresql://user@host/db URL of an empty PostgreSQL store")
    ],
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="The SQLite store to copy, with serve stopped [the data directory's pgplane.db]",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Copy a SQLite store into an empty PostgreSQL database, whole or not at all; then run
    `pgplane serve --store` with that URL on the same data directory."""
    import psycopg  # noqa: PLC0415

    from pgplane.errors import PgplaneError  # noqa: PLC0415
    from pgplane.store.copy import copy_store  # noqa: PLC0415
    from pgplane.store.open import is_postgresql  # noqa: PLC0415

    if not is_postgresql(target):
        typer.echo("error: --to: expected a postgresql:// URL", err=True)
        raise typer.Exit(2)
    if source is None:
        source = settings_from_env(data_dir=data_dir).store_path
    try:
        counts = asyncio.run(copy_store(source, target))
    except PgplaneError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    except psycopg.Error as exc:  # the server not reached, say (its message holds no password)
        typer.echo(f"error: the PostgreSQL store: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({"copied": counts, "rows": sum(counts.values())}, indent=2))
