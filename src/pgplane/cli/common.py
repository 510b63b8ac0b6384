"""What the CLI's commands share: the data directory option, one store transaction, and saying
what a slow command is doing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from pgplane.config import settings_from_env
from pgplane.telemetry import progress

if TYPE_CHECKING:
    from pgplane.store import Store, Tx

T = TypeVar("T")

log = logging.getLogger("pgplane.cli")

# A command waits this long for the store a busy `serve` is writing (a request waits 5 s): it
# says so while it waits, and a person can stop it.
STORE_BUSY_SECONDS = 60.0

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where pgplane keeps its store and databases "
        "[default: $PGPLANE_DATA_DIR, else ~/.local/share/pgplane]",
        show_default=False,
    ),
]


def say_progress() -> None:
    """The platform's log, INFO and up, as plain ``pgplane: …`` lines on stderr: what a slow
    command waits for (the store locked by another process, a migration, a step past a
    second, see telemetry/progress.py). A quick command prints nothing there."""
    platform = logging.getLogger("pgplane")
    if any(getattr(h, "pgplane_cli", False) for h in platform.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("pgplane: %(message)s"))
    handler.pgplane_cli = True  # type: ignore[attr-defined]
    platform.addHandler(handler)
    platform.setLevel(logging.INFO)
    platform.propagate = False


def in_store(data_dir: Path | None, work: Callable[[Tx], Awaitable[T]]) -> T:
    """Run ``work`` in one write transaction on the data directory's store; exit 2 with the
    message on a platform error."""

    async def once(store: Store) -> T:
        async with contextlib.AsyncExitStack() as stack:
            with progress.step(log, "waiting for the store's write lock"):
                tx = await stack.enter_async_context(store.write())
            return await work(tx)

    return on_store(data_dir, once)


def platform_dir(data_dir: Path | None) -> Path | None:
    """The data directory a command works on: the one named (``--data-dir``,
    ``$PGPLANE_DATA_DIR``), else the default's when its ``serve`` runs or nothing else does,
    else the one ``serve`` running elsewhere holds (said on stderr). Never a store made
    silently beside a running platform: with none found, or several running, exit 2 saying
    which ``--data-dir`` to give."""
    from pgplane.serverlock import serving  # noqa: PLC0415

    if (
        data_dir is not None
        or os.environ.get("PGPLANE_DATA_DIR")
        or os.environ.get("PGPLANE_STORE")
    ):
        return data_dir
    defaults = settings_from_env()
    default = defaults.data_dir
    running = serving()
    if default.resolve() in running:
        return None
    if len(running) == 1:
        typer.echo(f"pgplane: the data directory of the running serve: {running[0]}", err=True)
        return running[0]
    if running:
        named = ", ".join(str(p) for p in running)
        typer.echo(f"error: pgplane serve runs on {named}: name one with --data-dir", err=True)
        raise typer.Exit(2)
    if not defaults.store_path.exists():
        typer.echo(
            f"error: no platform in {default} (the default data directory) and no pgplane serve"
            " running: start `pgplane serve`, which makes it, or name the data directory with"
            " --data-dir",
            err=True,
        )
        raise typer.Exit(2)
    return None


def on_store(data_dir: Path | None, work: Callable[[Store], Awaitable[T]]) -> T:
    """Run ``work`` with the data directory's store open (for a command that watches it);
    exit 2 with the message on a platform error."""
    from pgplane.errors import PgplaneError  # noqa: PLC0415
    from pgplane.store.open import open_store  # noqa: PLC0415
    from pgplane.store.sqlite import SqliteStore  # noqa: PLC0415

    settings = settings_from_env(data_dir=platform_dir(data_dir))
    say_progress()

    async def run() -> T:
        # In a thread: migrating an older SQLite store, or waiting for another process' lock,
        # blocks. (A PostgreSQL store's URL is not said: it may hold a password.)
        where = settings.store_path if settings.store is None else "on PostgreSQL"
        with progress.step(log, f"opening the store {where}"):
            if settings.store is None:
                store: Store = await asyncio.to_thread(
                    SqliteStore, settings.store_path, busy_seconds=STORE_BUSY_SECONDS
                )
            else:
                store = await open_store(settings.store, settings.store_path)
        try:
            return await work(store)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except PgplaneError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
