"""What ``pgplane serve`` opens before it serves: the compute driver, the store, the figures for
/metrics, the shared storage, and this process's place as a node; each step that cannot be done
ends the process with a message an operator reads, never a traceback."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from pgplane import __version__
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig
from pgplane.compute.local.shared.objects import ObjectStore
from pgplane.config import Settings
from pgplane.core.operations import Action
from pgplane.engine.node import NodeLease, node_name
from pgplane.errors import Unavailable
from pgplane.objectstore import claim
from pgplane.objectstore.bucket import Bucket, open_bucket
from pgplane.services.nodes import NameTaken
from pgplane.store import Store
from pgplane.store.open import open_store
from pgplane.telemetry import logs
from pgplane.telemetry.metrics import NO_METRICS, Metrics
from pgplane.telemetry.prometheus import Prometheus

log = logging.getLogger("pgplane")


async def store(settings: Settings, metrics: Metrics) -> Store:
    try:
        return await open_store(
            settings.store,
            settings.store_path,
            metrics,
            pool_size=settings.store_pool_size,
            name=f"pgplane {node_name(settings)}",
        )
    except Unavailable as exc:  # a PostgreSQL store that cannot be reached
        raise SystemExit(f"pgplane: {exc.message}") from None


def metrics(settings: Settings) -> Metrics:
    """The figures kept for /metrics, and the logs, each naming this node."""
    try:
        name = node_name(settings)
    except ValueError as exc:
        raise SystemExit(f"pgplane: {exc}") from None
    logs.set_node(name)
    if not settings.metrics:
        return NO_METRICS
    return Prometheus(version=__version__, actions=Action, node=name)


async def shared_storage(driver: LocalComputeDriver) -> str | None:
    """The shared storage's id (made there on first use), read before the node registers."""
    try:
        shared = await asyncio.to_thread(driver.shared_storage)
    except OSError as exc:
        raise SystemExit(f"pgplane: the shared storage cannot be used: {exc}") from None
    if shared is not None:
        log.info("shared storage %s: the cold archive and history go there", shared)
    return shared


async def register(
    store: Store, settings: Settings, metrics: Metrics, shared: str | None
) -> NodeLease:
    """This process as a node of the platform, before it touches any project."""
    try:
        node = NodeLease(store, settings, metrics, shared)
        await node.register(settings.proxy_port)
    except (ValueError, NameTaken, Unavailable) as exc:
        await store.close()
        message = exc.message if isinstance(exc, Unavailable) else str(exc)
        raise SystemExit(f"pgplane: {message}") from None
    return node


async def object_store(settings: Settings, store: Store) -> Bucket | None:
    """The object store, checked writable and claimed for this platform (with a SQLite store,
    its lease taken: a PostgreSQL store's nodes hold leases of their own there), or None
    without one: then the data lives on this disk only, and the log says so."""
    if settings.object_store is None or settings.archive_key_file is None:
        if settings.shared_dir is None:
            log.warning(
                "no object store: every database, its history and the store live on this disk"
                " only (--object-store s3://BUCKET/PREFIX keeps them off the machine)"
            )
        return None
    try:
        async with store.write() as tx:
            platform = await claim.platform_id(tx)
        bucket = await asyncio.to_thread(
            open_bucket, settings.object_store, settings.archive_key_file
        )
        await asyncio.to_thread(bucket.raw.check_writable)
        await asyncio.to_thread(
            claim.own, bucket.raw, platform=platform, fingerprint=bucket.fingerprint
        )
        if settings.store is None:
            lease = claim.PrefixLease(bucket.raw, platform=platform, instance=node_name(settings))
            await asyncio.to_thread(lease.take)
            bucket.sealed.lease = lease
    except (ValueError, ComputeError, claim.Refused, Unavailable) as exc:
        await store.close()
        message = exc.message if isinstance(exc, Unavailable) else str(exc)
        raise SystemExit(f"pgplane: object store {settings.object_store}: {message}") from None
    log.info("object store %s: the platform's data is kept there, sealed", settings.object_store)
    return bucket


def local_driver(settings: Settings, objects: ObjectStore | None = None) -> LocalComputeDriver:
    """The compute driver the settings describe, on the object store ``objects`` (sealed)."""
    return LocalComputeDriver(
        LocalDriverConfig(
            data_dir=settings.data_dir,
            pg_bin_dirs=settings.pg_bin_dirs,
            compute_user=settings.compute_user,
            listen_host=settings.compute_host,
            disk_reserve_bytes=settings.disk_reserve_bytes,
            history_base_bytes=settings.history_base_bytes,
            walls=settings.walls,
            disk_per_project_bytes=settings.disk_per_project << 20,
            branch_size_limit_mib=settings.branch_size_limit,
            shared_dir=settings.shared_dir,
            archive_timeout_seconds=settings.segment_timeout_seconds,
            object_store=objects,
        )
    )


async def driver(
    settings: Settings, objects: ObjectStore | None = None
) -> tuple[LocalComputeDriver, Settings]:
    """The compute driver, and the settings with the Postgres versions it serves."""
    driver = local_driver(settings, objects)
    settings = dataclasses.replace(settings, pg_versions=tuple(driver.pg_versions()))
    log.info("PostgreSQL versions available: %s", ", ".join(map(str, settings.pg_versions)))
    await driver.apply_size_limit()
    return driver, settings
