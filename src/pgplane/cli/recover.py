"""``pgplane recover``: the platform brought back from its object store (objectstore/recover.py
says how), and the options it shares with ``serve``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from pgplane.cli.common import DataDir, say_progress
from pgplane.config import Settings, settings_from_env

ObjectStoreOption = Annotated[
    str | None,
    typer.Option(
        help="s3://BUCKET/PREFIX where the platform keeps its data (endpoint, region and"
        " credentials from the standard AWS variables and files); default:"
        " $PGPLANE_OBJECT_STORE, else this disk only",
        show_default=False,
    ),
]
ArchiveKeyOption = Annotated[
    Path | None,
    typer.Option(
        help="A file of at least 32 random bytes, kept off the machine too: every object is"
        " sealed with keys derived from it; default: $PGPLANE_ARCHIVE_KEY_FILE",
        show_default=False,
    ),
]


def with_object_store(
    data_dir: Path | None, object_store: str | None, archive_key_file: Path | None
) -> Settings:
    """The settings, with these options over the environment; exit 2 naming what is wrong."""
    try:
        return settings_from_env(
            data_dir=data_dir, object_store=object_store, archive_key_file=archive_key_file
        )
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def recover_command(
    data_dir: DataDir = None,
    object_store: ObjectStoreOption = None,
    archive_key_file: ArchiveKeyOption = None,
) -> None:
    """Bring the platform back from its object store into an empty data directory: its store
    (accounts, keys, projects, branches, endpoints, roles, snapshots) and every branch's data
    at its newest shipped point. Prints what came back (each branch with the time it is
    recovered to) and what could not; exits 1 if anything could not. Then `pgplane serve` on
    the directory, with the same object store and key, serves it."""
    from pgplane.objectstore.recover import NotRecoverable, recover  # noqa: PLC0415

    settings = with_object_store(data_dir, object_store, archive_key_file)
    if settings.object_store is None:
        typer.echo("error: recover needs --object-store (PGPLANE_OBJECT_STORE)", err=True)
        raise typer.Exit(2)
    say_progress()
    try:
        report = asyncio.run(recover(settings))
    except NotRecoverable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(report.document(), indent=2))
    if report.lost:
        typer.echo(
            f"error: {len(report.lost)} thing(s) did not come back: see not_recovered", err=True
        )
        raise typer.Exit(1)
