"""``pgplane serve``: one process running the API, the operations engine, the scheduler and the
Postgres proxy.

This is the only place that wires concrete pieces together: the store (SQLite, or PostgreSQL
with ``--store``), the local compute
driver, the engine, the proxy and the ASGI app.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import socket
from concurrent.futures import ThreadPoolExecutor

import uvicorn

from pgplane import startup
from pgplane.api import create_app
from pgplane.api.health import Readiness
from pgplane.api.http import HttpLimits, protocol_with
from pgplane.api.listener import ApiServer
from pgplane.api.logcontext import with_request_ids
from pgplane.compute.driver import ComputeError
from pgplane.compute.local import LocalComputeDriver
from pgplane.compute.local.tenants.volumes import MIN_BYTES as MIN_SHARE_BYTES
from pgplane.config import Settings
from pgplane.core import scrub
from pgplane.engine import Engine
from pgplane.engine.history_handlers import keep_history, ship_history
from pgplane.engine.node import NodeLease
from pgplane.engine.project_data import ProjectData
from pgplane.engine.reconcile import reconcile
from pgplane.engine.scheduler import Scheduler
from pgplane.engine.shutdown import report_running, suspend_all
from pgplane.errors import Unavailable
from pgplane.fdlimit import gates
from pgplane.gateway import ComputeWaker
from pgplane.listening import bind_ports
from pgplane.node_channel import open_channel
from pgplane.objectstore.bucket import Bucket
from pgplane.objectstore.recover import UNFINISHED
from pgplane.objectstore.storecopy import StoreCopies
from pgplane.objectstore.verify import run_checks
from pgplane.proxy.activity import Activity
from pgplane.proxy.server import ALPN, Proxy
from pgplane.proxy.session import Sessions
from pgplane.proxy.sqlhttp.handler import SqlOverHttp
from pgplane.proxy.sqlhttp.pool import Pool
from pgplane.proxy.sqlhttp.run import Limits
from pgplane.proxy.throttle import LoginThrottle
from pgplane.proxy_tls import proxy_certificate
from pgplane.serverlock import AlreadyServing, ServerLock
from pgplane.services import signin
from pgplane.services.proxy_authority import NotCovered
from pgplane.store import Store
from pgplane.telemetry.metrics import Metrics
from pgplane.tls import ProxyTLS, certificate_hash, server_context

log = logging.getLogger("pgplane")

# How long --stop-computes waits for the suspends (a checkpoint each); the rest are left to the
# next start, which adopts what still runs and finishes the operations.
_STOP_COMPUTES_SECONDS = 60.0
_PLATFORM_THREADS = 32


async def _announce(server: uvicorn.Server, settings: Settings, store: Store) -> None:
    while not server.started:  # noqa: ASYNC110 - uvicorn offers no event for "bound"
        await asyncio.sleep(0.01)
    console = ""
    for srv in server.servers:
        for sock in srv.sockets:
            host, port = sock.getsockname()[:2]
            log.info("pgplane API listening on http://%s:%d/api/v2", host, port)
            shown = "localhost" if host in ("0.0.0.0", "::") else host  # noqa: S104
            console = console or f"http://{shown}:{port}/console"
    log.info("pgplane console: %s", console)
    # For `pgplane accounts invite`, run later without the address: the links it prints
    # point where this server serves.
    with contextlib.suppress(OSError):
        settings.console_url_path.write_text(f"{console}\n")
    log.info("pgplane data directory: %s", settings.data_dir)
    # A fresh platform has no account that can sign in: the first comes from a one-time link,
    # as notebook servers and Grafana do it (more: `pgplane accounts create/invite`).
    try:
        async with store.write() as tx:
            token = (
                await signin.new_signup_link(tx)
                if await tx.count_accounts_with_password() == 0
                else None
            )
    except Unavailable as exc:  # the store's disk is full, say: the next start offers it
        log.warning("pgplane console: no sign-up link this time: %s", exc.message)
        return
    if token is not None:
        log.warning(
            "pgplane has no account yet: create the first one at %s/signup?token=%s"
            " (the link works once)",
            console,
            token,
        )


def _sql_over_http(settings: Settings, sessions: Sessions) -> SqlOverHttp:
    """The proxy's ``POST /sql``, bounded as the settings say."""
    for name in (
        "sql_over_http_timeout_seconds",
        "sql_over_http_max_response_bytes",
        "sql_over_http_max_rows",
        "sql_over_http_pool_per_role",
        "sql_over_http_pool_total",
    ):
        if getattr(settings, name) <= 0:
            raise SystemExit(f"pgplane: PGPLANE_{name.upper()} must be more than 0")
    return SqlOverHttp(
        sessions=sessions,
        limits=Limits(
            response_bytes=settings.sql_over_http_max_response_bytes,
            rows=settings.sql_over_http_max_rows,
            seconds=settings.sql_over_http_timeout_seconds,
        ),
        pool=Pool(
            per_key=settings.sql_over_http_pool_per_role,
            total=settings.sql_over_http_pool_total,
        ),
    )


def _check_limits(settings: Settings) -> None:
    if settings.compute_starts_per_minute < 0 or settings.compute_starts_burst < 1:
        raise SystemExit(
            "pgplane: PGPLANE_COMPUTE_STARTS_PER_MINUTE must not be negative (0: no pace) and"
            " PGPLANE_COMPUTE_STARTS_BURST must be 1 or more"
        )
    if settings.branch_size_limit < 0:
        raise SystemExit("pgplane: PGPLANE_BRANCH_SIZE_LIMIT must not be negative (0: no limit)")
    if settings.disk_per_project < 0 or 0 < settings.disk_per_project < MIN_SHARE_BYTES >> 20:
        raise SystemExit(
            f"pgplane: PGPLANE_DISK_PER_PROJECT must be 0 (no shares) or at least"
            f" {MIN_SHARE_BYTES >> 20} (MiB)"
        )
    if settings.http_idle_timeout_seconds < 1:
        raise SystemExit("pgplane: PGPLANE_HTTP_IDLE_TIMEOUT_SECONDS must be 1 or more")


async def serve(settings: Settings) -> None:
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    scrub.hide(settings.data_dir)  # from what operations and the API tell tenants
    lock = ServerLock(settings.data_dir)
    try:
        lock.acquire()  # before anything touches the store or a compute
    except AlreadyServing as exc:
        raise SystemExit(f"pgplane: {exc}") from None
    try:
        if (settings.data_dir / UNFINISHED).exists():
            raise SystemExit(
                f"pgplane: a recovery into {settings.data_dir} did not finish: run"
                " `pgplane recover` again with the same object store and key"
            )
        await _serve(settings)
    finally:
        lock.release()


async def _proxy_certificate(settings: Settings, store: Store, node: NodeLease) -> ProxyTLS:
    try:
        return await proxy_certificate(settings, store, node.name)
    except NotCovered as exc:
        await node.release()  # refused: no project may be placed on it meanwhile
        await store.close()
        raise SystemExit(f"pgplane: {exc}") from None


async def _start_proxy(
    proxy: Proxy, sockets: list[socket.socket], settings: Settings, node: NodeLease
) -> Settings:
    """The proxy accepting on its sockets; the settings with the port it has (0 asked the
    system for one)."""
    bound = proxy.adopt(sockets)
    # With port 0 the system chose: endpoints and connection URIs must name the real one.
    if settings.proxy_port != bound[0][1]:
        await node.update_address(bound[0][1])
    settings = dataclasses.replace(settings, proxy_port=bound[0][1])
    for host, port in bound:
        log.info("pgplane Postgres proxy listening on %s:%d", host, port)
    return settings


async def _serve(settings: Settings) -> None:
    _check_limits(settings)
    bound = bind_ports(settings)
    # The platform's own blocking work (file reads and writes, copies of bases, the object
    # store's calls) waits in the default pool. Python sizes it by cores (6 on 2), and long
    # operations hold a thread each for minutes: a wake's file reads must never queue behind
    # them. Tenants' processes are waited on elsewhere (compute.local.tenants.waits).
    asyncio.get_running_loop().set_default_executor(
        ThreadPoolExecutor(_PLATFORM_THREADS, thread_name_prefix="pgplane-io")
    )
    api_gate, proxy_gate = gates(settings)
    metrics = startup.metrics(settings)
    store = await startup.store(settings, metrics)
    bucket = await startup.object_store(settings, store)
    driver, settings = await startup.driver(settings, None if bucket is None else bucket.sealed)
    node = await startup.register(store, settings, metrics, await startup.shared_storage(driver))
    # Renewed from here on, through the slow steps of the start (adopting computes, the proxy):
    # a lease that lapsed before the first heartbeat would show a node that is starting as down.
    node_task = asyncio.create_task(node.run(), name="node heartbeat")
    tls = await _proxy_certificate(settings, store, node)
    await reconcile(store, driver, node.name)
    engine = Engine(store=store, driver=driver, settings=settings, metrics=metrics, node=node.name)
    activity = Activity(metrics)
    channel = await open_channel(store, settings, node.name)
    waker = ComputeWaker(
        store=store,
        engine=engine,
        driver=driver,
        settings=settings,
        metrics=metrics,
        link=channel.link,
    )
    proxy = Proxy(
        computes=waker,
        forwarder=channel.forwarder(),
        activity=activity,
        throttle=LoginThrottle(metrics=metrics),
        proxy_host=settings.proxy_host,
        server_tls=server_context(tls, alpn_protocols=ALPN),
        cert_hash=certificate_hash(tls.pair),
        gate=proxy_gate,
        handshake_timeout=settings.proxy_handshake_timeout_seconds,
    )
    proxy.plug_sql(sql := _sql_over_http(settings, proxy.sessions))
    settings = await _start_proxy(proxy, bound.proxy, settings, node)
    data = ProjectData(store, node.name, driver, channel.link)
    await channel.start(
        waker,
        proxy.sessions,
        data,
        settings=settings,
        store=store,
        node=node,
        caps=proxy_gate,
    )
    scheduler = Scheduler(
        store=store,
        engine=engine,
        driver=driver,
        settings=settings,
        activity=activity,
        metrics=metrics,
        node=node.name,
    )
    readiness = Readiness(store)
    app = create_app(
        store=store,
        settings=settings,
        check_settings=driver.check_settings,
        history=data.history_bounds,
        schema=data.dump_schema,
        notify=engine.wake,
        readiness=readiness,
        metrics=metrics,
    )
    server = ApiServer(
        uvicorn.Config(
            with_request_ids(app),
            host=settings.host,
            port=settings.port,
            # httptools, with deadlines, connection caps and the error body (api/http.py).
            http=protocol_with(
                HttpLimits(
                    header_seconds=settings.http_header_timeout_seconds,
                    body_seconds=settings.http_body_timeout_seconds,
                    gate=api_gate,
                )
            ),
            lifespan="on",
            access_log=False,
            # No proxy in front by default: trusting X-Forwarded-For would let any client choose
            # the address recorded as a key's last use. Fewer per-request steps, too.
            proxy_headers=False,
            server_header=False,
            log_config=None,
            timeout_graceful_shutdown=5,
            timeout_keep_alive=settings.http_idle_timeout_seconds,  # config.py says why 75 s
        )
    )
    # Everything allocated so far lives as long as the process: move it out of the collector's
    # sight, so full collections under load stop scanning it (they caused 100+ ms pauses).
    gc.collect()
    gc.freeze()
    workers = (
        *_start_workers(engine, scheduler, readiness, driver, settings, store, node.name, metrics),
        *_start_bucket(bucket, settings, metrics),
    )
    announce = asyncio.create_task(_announce(server, settings, store))
    try:
        await server.serve(sockets=bound.api)
    finally:
        announce.cancel()
        await proxy.close()  # no new sessions, and no wakes, from here on
        await channel.close()
        sql.close()
        if settings.stop_computes:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_STOP_COMPUTES_SECONDS):
                    await suspend_all(store, engine)
        await report_running(driver)
        for task in (node_task, *workers):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await driver.close()
        await node.release()
        await store.close()
        await _release(bucket)
        log.info("pgplane stopped")


def _start_workers(
    engine: Engine,
    scheduler: Scheduler,
    readiness: Readiness,
    driver: LocalComputeDriver,
    settings: Settings,
    store: Store,
    node: str,
    metrics: Metrics,
) -> tuple[asyncio.Task[None], ...]:
    """The background work of a running node, last stopped first."""
    engine_task = asyncio.create_task(engine.run(), name="operations engine")
    scheduler_task = asyncio.create_task(scheduler.run(), name="scheduler")
    readiness.watch("operations", engine_task)
    readiness.watch("scheduler", scheduler_task)
    history = asyncio.create_task(keep_history(driver, settings), name="history")
    ship = asyncio.create_task(
        ship_history(driver, settings, store, node, metrics), name="history shipping"
    )
    checks = asyncio.create_task(run_checks(settings, store, node, metrics), name="backup checks")
    return checks, ship, history, scheduler_task, engine_task


def _start_bucket(
    bucket: Bucket | None, settings: Settings, metrics: Metrics
) -> tuple[asyncio.Task[None], ...]:
    """The claim on the object store's prefix made (when the store did not answer at start)
    and its lease renewed, and the store copied there as it changes (stopped last: its final
    copy is taken after everything else has stopped)."""
    if bucket is None:
        return ()
    tasks = []
    if settings.store is None:  # a PostgreSQL store is the operator's own database
        copies = StoreCopies(bucket.sealed, settings.store_path, metrics)
        tasks.append(asyncio.create_task(copies.run(settings.store_copy_seconds), name="copies"))
    if bucket.sealed.claim is not None:
        tasks.append(asyncio.create_task(bucket.sealed.claim.run(), name="object store claim"))
    return tuple(tasks)


async def _release(bucket: Bucket | None) -> None:
    """The lease on the object store's prefix ended: a recovery need not wait for it."""
    if bucket is not None and bucket.sealed.lease is not None:
        with contextlib.suppress(ComputeError):
            await asyncio.to_thread(bucket.sealed.lease.release)


def run(settings: Settings) -> None:
    """Run the server until SIGINT/SIGTERM, on uvloop (a dependency, where it builds)."""
    try:
        import uvloop  # noqa: PLC0415 - not on Windows, where asyncio's loop serves
    except ImportError:  # pragma: no cover
        asyncio.run(serve(settings))
    else:
        uvloop.run(serve(settings))
