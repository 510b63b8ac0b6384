"""What the CLI's commands share: the data directory option, and one store transaction."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from pgplane.config import settings_from_env

if TYPE_CHECKING:
    from pgplane.store import Tx

T = TypeVar("T")

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where pgplane keeps its store and databases "
        "[default: $PGPLANE_DATA_DIR, else ~/.local/share/pgplane]",
        show_default=False,
    ),
]


def in_store(data_dir: Path | None, work: Callable[[Tx], Awaitable[T]]) -> T:
    """Run ``work`` in one write transaction on the data directory's store; exit 2 with the
    message on a platform error."""
    from pgplane.errors import PgplaneError  # noqa: PLC0415
    from pgplane.store.open import open_store  # noqa: PLC0415

    settings = settings_from_env(data_dir=data_dir)

    async def run() -> T:
        store = await open_store(settings.store, settings.store_path)
        try:
            async with store.write() as tx:
                return await work(tx)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except PgplaneError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
