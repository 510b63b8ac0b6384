"""What ``pgplane serve`` opens before it serves: the compute driver, the store, the figures for
/metrics, the shared storage, and this process's place as a node; each step that cannot be done
ends the process with a message an operator reads, never a traceback."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

from pgplane import __version__
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig
from pgplane.compute.local.files import write_atomic
from pgplane.compute.local.shared.objects import ObjectStore, Unreachable
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

# How long a start waits for the object store to answer: a restart during its outage then
# serves (the computes' clients kept waiting no longer than this), its claim made later.
_CLAIM_AT_START_SECONDS = 10.0
# The object store's identity as last read (root's file): what a start without the store uses.
_IDENTITY_FILE = "object-store.id"


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
            served = await tx.get_platform_id() is not None
            platform = await claim.platform_id(tx)
        bucket = await asyncio.to_thread(
            open_bucket, settings.object_store, settings.archive_key_file
        )
        instance = node_name(settings) if settings.store is None else None
        held = claim.Claim(
            bucket.raw,
            platform=platform,
            fingerprint=bucket.fingerprint,
            instance=instance,
            lease_seconds=settings.node_lease_seconds,
            renew_seconds=settings.node_heartbeat_seconds,
        )
        bucket.sealed.claim, bucket.sealed.lease = held, held.lease
        await _claim_at_start(held, bucket, settings, served=served)
    except (ValueError, ComputeError, claim.Refused, Unavailable) as exc:
        await store.close()
        message = exc.message if isinstance(exc, Unavailable) else str(exc)
        raise SystemExit(f"pgplane: object store {settings.object_store}: {message}") from None
    log.info("object store %s: the platform's data is kept there, sealed", settings.object_store)
    return bucket


async def _claim_at_start(
    held: claim.Claim, bucket: Bucket, settings: Settings, *, served: bool
) -> None:
    """The prefix claimed, and the store's identity kept in the data directory; if the store
    does not answer, a platform that served before (the identity kept) starts without it, its
    claim made later (Claim.run); a new one is refused."""
    kept = settings.data_dir / _IDENTITY_FILE
    try:
        async with asyncio.timeout(_CLAIM_AT_START_SECONDS):
            await held.attempt()
            identity = await asyncio.to_thread(lambda: bucket.raw.identity)
        await asyncio.to_thread(_keep_identity, kept, identity)
    except (Unreachable, TimeoutError) as exc:
        why = str(exc) or f"no answer in {_CLAIM_AT_START_SECONDS:.0f} s"
        known = await asyncio.to_thread(_read_identity, kept)
        if not served or known is None:
            raise ComputeError(why) from None
        bucket.raw.known_identity(known)
        log.warning(
            "object store: %s; serving from this disk, nothing written there until it answers"
            " and the prefix is claimed (its WAL waits on each project's disk share)",
            why,
        )


def _keep_identity(path: Path, identity: str) -> None:
    if _read_identity(path) != identity:
        write_atomic(path, identity.encode())


def _read_identity(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except FileNotFoundError:
        return None


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
            archive_sync=settings.archive_sync,
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
