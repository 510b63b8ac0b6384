"""Which store a process uses: ``--store``/``PGPLANE_STORE``, a ``postgresql://`` URL, or by
default the SQLite file in the data directory."""

from __future__ import annotations

from pathlib import Path

from pgplane.store.base import Store
from pgplane.telemetry.metrics import NO_METRICS, Metrics

_SCHEMES = ("postgresql://", "postgres://")


def is_postgresql(url: str) -> bool:
    return url.startswith(_SCHEMES)


def check_store_url(url: str | None) -> None:
    """Refuse at start-up what is neither unset nor a PostgreSQL URL (never echoing it: it may
    hold a password)."""
    if url is not None and not is_postgresql(url):
        raise ValueError("the store: expected a postgresql:// URL (or none, for SQLite)")


async def open_store(
    url: str | None,
    sqlite_path: Path,
    metrics: Metrics = NO_METRICS,
    *,
    pool_size: int | None = None,
    name: str = "pgplane",
) -> Store:
    """Connected, with its schema up to date. ``pool_size`` (PostgreSQL: its default when None)
    and ``name`` (what the server shows of its connections) are a PostgreSQL store's."""
    check_store_url(url)
    if url is None:
        from pgplane.store.sqlite import SqliteStore  # noqa: PLC0415

        return SqliteStore(sqlite_path, metrics)
    from pgplane.store.postgresql import PostgresStore  # noqa: PLC0415 - psycopg_pool on demand
    from pgplane.store.postgresql.store import POOL_SIZE  # noqa: PLC0415

    return await PostgresStore.open(
        url, metrics, pool_size=pool_size or POOL_SIZE, application_name=name
    )
