"""Platform settings: one frozen object built by the entry points and passed down.

Every interval is configurable (tests run the platform's timers in seconds); environment variables
``PGPLANE_*`` override the defaults, command-line options override both.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs


def default_data_dir() -> Path:
    """``$PGPLANE_DATA_DIR``, else the user's data home (``~/.local/share/pgplane``)."""
    env = os.environ.get("PGPLANE_DATA_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("pgplane", appauthor=False))


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path = field(default_factory=default_data_dir)
    # The platform's store: None, the SQLite file in the data directory; or a postgresql:// URL
    # (PGPLANE_STORE), for several processes sharing one control plane, with this many
    # connections per process (each node takes one more, for LISTEN).
    store: str | None = None
    store_pool_size: int = 10
    host: str = "127.0.0.1"
    port: int = 8080

    # Where computes listen (the proxy reaches them there).
    compute_host: str = "127.0.0.1"
    # Below every usual ephemeral range (Linux 32768-60999, IANA 49152-65535): a port there
    # can be taken by any outgoing connection on the machine while its compute is suspended,
    # and the compute would then fail to start.
    compute_ports: tuple[int, int] = (20000, 21999)
    compute_user: str | None = None  # OS user for Postgres when pgplane runs as root
    pg_bin_dirs: tuple[Path, ...] = ()
    # Free space a branch copy must leave on the data disk, so running computes can still write
    # their WAL; None: 5% of the disk, at most 1 GiB; negative: no check before a copy (a full
    # disk is then met in the middle of it, and the copy removed).
    disk_reserve_bytes: int | None = None
    region_id: str = "local"
    pg_versions: tuple[int, ...] = ()  # filled in by the entry point from the compute driver

    # The proxy: one listener for every endpoint. ``proxy_host`` is the name clients use: an
    # endpoint's host is ``ep-….<proxy_host>``. With wildcard DNS for it (or *.localhost resolving,
    # as under systemd-resolved), connection URIs name the endpoint by host (TLS SNI); without,
    # they name the proxy and pass ``options=endpoint=ep-…``, which works everywhere.
    proxy_listen: str = "127.0.0.1"
    proxy_port: int = 5432
    proxy_host: str = "localhost"
    proxy_wildcard_dns: bool = False
    tls_cert: Path | None = None  # with tls_key; None: generated once under the data directory
    tls_key: Path | None = None

    # The platform's own operations (the scheduler), in seconds.
    scheduler_seconds: float = 1.0
    default_suspend_timeout_seconds: int = 300  # what suspend_timeout_seconds 0 means
    availability_check_seconds: float = 3600.0  # per branch with a compute; 0: never
    detach_after_seconds: float = 30 * 86400.0  # idle time before tenant_detach; 0: never
    # How often running computes' usage (CPU, time, storage) is read and recorded: a compute
    # that crashes loses at most this much of its figures (a suspend records them whole).
    usage_seconds: float = 60.0
    # History: how often base states due are taken and what left each window is freed, and how
    # much WAL a branch archives before its next base state (or its data's size, if more).
    history_seconds: float = 60.0
    history_base_bytes: int = 256 << 20
    # Shared storage every node reaches (NFS in real life): where the cold archive lives and
    # where each branch's history is shipped to, so that projects can move between nodes and a
    # dead node's be brought back (compute/local/shared/). None: each node's own disk only.
    # ship_seconds: how often each branch's new WAL and base states are shipped there;
    # archive_timeout_seconds: how long a compute may keep a written WAL segment open before it
    # completes it (Postgres' archive_timeout, set only with shared storage; 0: never forced).
    # Together they bound what a dead node's projects lose: what was not shipped yet.
    shared_dir: Path | None = None
    ship_seconds: float = 10.0
    archive_timeout_seconds: int = 60
    # Object storage (S3 and the services that speak its API: R2, GCS, Ceph, MinIO, SeaweedFS):
    # ``s3://BUCKET/PREFIX``, its endpoint, region and credentials from the standard AWS
    # variables and files. Everything the platform keeps goes there, sealed with keys derived
    # from the operator's archive key (objectstore/): each branch's WAL and base states, the
    # snapshots, the cold archive, and a SQLite store's copy, so that `pgplane recover` brings
    # the platform back from the bucket alone. Every running compute's WAL is streamed there as
    # it is written (compute/local/shared/streaming.py: what the loss of the machine loses is
    # under a second of commits); whole segments are shipped every object_ship_seconds, a
    # written one completed within object_archive_timeout_seconds (fewer, fuller segments than
    # the 2 s that bounded the loss before the stream). archive_sync: a commit is acknowledged
    # to its client only once its WAL is there (nothing acknowledged is lost; commits wait while
    # the store does not answer).
    object_store: str | None = None
    archive_key_file: Path | None = None
    object_ship_seconds: float = 1.0
    object_archive_timeout_seconds: int = 60
    # With an object store, base states due are taken sooner: a recovery replays the WAL past
    # the newest, and at history_seconds' 60 s it replayed twice as much under load.
    object_history_seconds: float = 10.0
    archive_sync: bool = False
    # How often a changed SQLite store is copied there (accounts, keys, projects, operations).
    store_copy_seconds: float = 1.0
    # How often each branch's backups in the object store are proven to restore (weekly, as
    # `pgplane backups verify` does, in a scratch directory); 0: never by the platform itself.
    backup_verify_seconds: float = 7 * 86400.0
    # The largest schema (pg_dump --schema-only's SQL) GET …/schema returns; past it, a 422.
    schema_max_bytes: int = 16 << 20
    # As root: each compute in a sandbox (bubblewrap) and a cgroup of its size. Off only to
    # compare (bench/wake.py) or where the kernel refuses namespaces; the log says which.
    walls: bool = True
    # As root with the walls: each project's files (data, WAL, history) on a filesystem of its
    # own this big, so no project can fill the disk; sparse, so a cap and not a reservation.
    # 0: none. (compute/local/tenants/volumes.py)
    disk_per_project: int = 16384
    # On SIGINT/SIGTERM: suspend every running compute first (engine/shutdown.py). Off, they
    # outlive the process and the next start adopts them.
    stop_computes: bool = False
    # GET /metrics on the API's port (telemetry/metrics.py); off, nothing is counted at all (the
    # bench compares the two). The log's form: text for people, json for log collectors.
    metrics: bool = True
    log_format: str = "text"

    # This process as a node of the platform (several `serve` sharing a PostgreSQL store): its
    # name (None: the host's name and a hash of the data directory, stable across restarts), the
    # computes it may run (0: as many as its compute port range holds), and its heartbeat: it
    # renews its lease every node_heartbeat_seconds, and is down once node_lease_seconds pass
    # without one (three missed beats and more: a busy store is not a dead node).
    node_name: str | None = None
    node_capacity: int = 0
    node_heartbeat_seconds: float = 5.0
    node_lease_seconds: float = 20.0
    # Its node door (nodelink/), on a PostgreSQL store only (a SQLite store has one node): where
    # other nodes reach this one's computes and data. Listening on node_listen (None: the
    # proxy's address) and node_port (0: a port the system chooses; the store says which), and
    # dialled at node_advertise (None: node_listen, which must then be an address they reach).
    node_listen: str | None = None
    node_port: int = 0
    node_advertise: str | None = None

    # Operations engine.
    workers: int = 4
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    poll_seconds: float = 0.5
    max_attempts: int = 5
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 60.0
    # An attempt still running after this long is cancelled and counted as failed, so a hung
    # handler cannot hold its project forever. Generous: a branch copy or a detach of a large
    # project is legitimately slow. 0: no limit.
    attempt_timeout_seconds: float = 3600.0

    # API.
    max_body_bytes: int = 1 << 20
    key_use_flush_seconds: float = 5.0
    # Rate limits, Neon's figures (api/ratelimit.py); 0 turns one off.
    rate_limit_per_minute: int = 700  # per account, sustained
    rate_limit_burst_per_second: int = 40  # per account and route
    auth_failures_per_minute: int = 50  # per client address (IPv6: per /64)
    # Quotas, so one key cannot fill a shared machine (services/quotas.py); 0 turns one off.
    # Live projects per account: each is a cluster on disk with a day of history by default.
    # Live branches per project: Neon's branches_limit. Shown in /users/me and project owners.
    projects_per_account: int = 20
    branches_per_project: int = 5000
    # Computes of an account running (or due to start) at once, and the sum of their
    # autoscaling_limit_max_cu. As many computes as projects: every project's default compute
    # may run at once. 32 CU: twice the largest compute (16 CU), so any size can still start.
    running_computes_per_account: int = 20
    compute_units_per_account: float = 32.0
    # Compute starts per account (engine/pacing.py): a burst at once, then so many a minute; the
    # rest wait their turn. 0 a minute: no pace.
    compute_starts_per_minute: int = 60
    compute_starts_burst: int = 20
    # The oldest Postgres major new projects may have (0: any available; the default, with a
    # warning for 15 and older, which hand any role with CREATEROLE the OS user of its compute).
    # Projects made before keep their major: branches and wakes work whatever this says.
    min_pg_version: int = 0
    # The logical size a branch may reach (its databases' relations, WAL not counted), in MiB,
    # enforced inside each compute as Neon does (compute/local/postgres/limits/): once reached,
    # statements that add data fail with SQLSTATE 53100; reads and deletes go on. Shown as the
    # projects' branch_logical_size_limit. 0: no limit. A new value reaches running computes
    # when serve starts with it (a reload, no restart).
    branch_size_limit: int = 3072

    # Connection hygiene (api/http.py, connlimits.py, fdlimit.py). A request's headers must arrive
    # within http_header_timeout_seconds of the connection (or of its first byte after the last
    # request), its body within http_body_timeout_seconds of them; a kept-alive connection idle
    # for http_idle_timeout_seconds is closed (whole seconds: uvicorn's keep-alive timer). Longer
    # than clients keep idle connections (httpx and requests: 5 s, uvicorn's own default too):
    # the client closes first, never racing a request against our close, which it sees as a
    # dropped connection (measured: 200 pollers each 1 s got some).
    http_header_timeout_seconds: float = 20.0
    http_body_timeout_seconds: float = 60.0
    http_idle_timeout_seconds: int = 75
    # Open connections per client address (IPv6: per /64) and in all, on each listener; 0 per
    # address: no cap; 0 in all: as many as the descriptor limit allows. Totals are cut down at
    # start-up where the descriptor limit would leave no reserve for the store and computes.
    api_connections_per_address: int = 256
    api_max_connections: int = 4096
    proxy_connections_per_address: int = 256
    proxy_max_connections: int = 4096
    # From connecting to authenticated, on the proxy (a wake after it is not counted). For every
    # deadline but the idle one, 0 means none.
    proxy_handshake_timeout_seconds: float = 30.0
    # SQL over HTTP (proxy/sqlhttp/): what one request may take (a query's time, its answer's
    # bytes and rows; Neon's proxy allows 10 MiB), and the compute connections kept between
    # requests, per endpoint and role and in all.
    sql_over_http_timeout_seconds: float = 15.0
    sql_over_http_max_response_bytes: int = 10 << 20
    sql_over_http_max_rows: int = 1_000_000
    sql_over_http_pool_per_role: int = 10
    sql_over_http_pool_total: int = 200

    @property
    def shipping_seconds(self) -> float:
        """How often each branch's new history is shipped: more often to an object store,
        which is what the platform's data outlives the machine by."""
        return self.object_ship_seconds if self.object_store else self.ship_seconds

    @property
    def keep_history_seconds(self) -> float:
        """How often base states due are taken and old history freed: sooner with an object
        store, whose recovery replays the WAL after the newest base state."""
        if self.object_store:
            return min(self.history_seconds, self.object_history_seconds)
        return self.history_seconds

    @property
    def segment_timeout_seconds(self) -> int:
        """How long a compute may keep a written WAL segment open (0: until it is full)."""
        if self.object_store:
            return self.object_archive_timeout_seconds
        return self.archive_timeout_seconds if self.shared_dir else 0

    @property
    def store_path(self) -> Path:
        return self.data_dir / "pgplane.db"

    @property
    def proxy_address(self) -> str:
        """``proxy_host``, with the port when it is not Postgres' usual one."""
        port = "" if self.proxy_port == 5432 else f":{self.proxy_port}"
        return f"{self.proxy_host}{port}"

    def endpoint_host(self, endpoint_id: str) -> str:
        """An endpoint's host as Neon gives it: ``ep-….<proxy_host>`` (and the port if unusual)."""
        return f"{endpoint_id}.{self.proxy_address}"

    @property
    def tls_dir(self) -> Path:
        return self.data_dir / "tls"

    @property
    def console_url_path(self) -> Path:
        """Where ``serve`` notes the console's address (``accounts invite`` links to it)."""
        return self.data_dir / "console.url"


def settings_from_env(**overrides: object) -> Settings:
    """Settings from ``PGPLANE_*`` variables, then explicit overrides (None means unset)."""
    env: dict[str, object] = {}
    for name, cast in (
        ("compute_host", str),
        ("proxy_host", str),
        ("proxy_listen", str),
        ("proxy_port", int),
        ("scheduler_seconds", float),
        ("default_suspend_timeout_seconds", int),
        ("availability_check_seconds", float),
        ("detach_after_seconds", float),
        ("usage_seconds", float),
        ("history_seconds", float),
        ("history_base_bytes", int),
        ("ship_seconds", float),
        ("archive_timeout_seconds", int),
        ("object_store", str),
        ("object_ship_seconds", float),
        ("object_archive_timeout_seconds", int),
        ("object_history_seconds", float),
        ("store_copy_seconds", float),
        ("backup_verify_seconds", float),
        ("schema_max_bytes", int),
        ("compute_user", str),
        ("store", str),
        ("store_pool_size", int),
        ("region_id", str),
        ("workers", int),
        ("node_name", str),
        ("node_capacity", int),
        ("node_heartbeat_seconds", float),
        ("node_lease_seconds", float),
        ("node_listen", str),
        ("node_port", int),
        ("node_advertise", str),
        ("poll_seconds", float),
        ("lease_seconds", float),
        ("heartbeat_seconds", float),
        ("retry_base_seconds", float),
        ("attempt_timeout_seconds", float),
        ("key_use_flush_seconds", float),
        ("max_attempts", int),
        ("disk_reserve_bytes", int),
        ("rate_limit_per_minute", int),
        ("rate_limit_burst_per_second", int),
        ("auth_failures_per_minute", int),
        ("projects_per_account", int),
        ("branches_per_project", int),
        ("running_computes_per_account", int),
        ("compute_units_per_account", float),
        ("compute_starts_per_minute", int),
        ("compute_starts_burst", int),
        ("min_pg_version", int),
        ("disk_per_project", int),
        ("branch_size_limit", int),
        ("http_header_timeout_seconds", float),
        ("http_body_timeout_seconds", float),
        ("http_idle_timeout_seconds", int),
        ("api_connections_per_address", int),
        ("api_max_connections", int),
        ("proxy_connections_per_address", int),
        ("proxy_max_connections", int),
        ("proxy_handshake_timeout_seconds", float),
        ("sql_over_http_timeout_seconds", float),
        ("sql_over_http_max_response_bytes", int),
        ("sql_over_http_max_rows", int),
        ("sql_over_http_pool_per_role", int),
        ("sql_over_http_pool_total", int),
    ):
        raw = os.environ.get(f"PGPLANE_{name.upper()}")
        if raw:
            env[name] = cast(raw)
    ports = os.environ.get("PGPLANE_COMPUTE_PORTS")
    if ports:  # "low-high": two platforms on one machine need ranges of their own
        low, _, high = ports.partition("-")
        env["compute_ports"] = (int(low), int(high))
    for name, variable in (
        ("walls", "PGPLANE_WALLS"),
        ("stop_computes", "PGPLANE_STOP_COMPUTES"),
        ("archive_sync", "PGPLANE_ARCHIVE_SYNC"),
        ("metrics", "PGPLANE_METRICS"),
    ):
        value = os.environ.get(variable)
        if value:
            if value not in ("on", "off"):
                raise ValueError(f"{variable}={value!r}: expected on or off")
            env[name] = value == "on"
    log_format = os.environ.get("PGPLANE_LOG_FORMAT")
    if log_format:
        if log_format not in ("text", "json"):
            raise ValueError(f"PGPLANE_LOG_FORMAT={log_format!r}: expected text or json")
        env["log_format"] = log_format
    env.update(_paths_from_env())
    env.update({k: v for k, v in overrides.items() if v is not None})
    settings = Settings(**env)  # type: ignore[arg-type]
    _check_store(settings)
    _check_object_store(settings)
    return settings


def _paths_from_env() -> dict[str, object]:
    env: dict[str, object] = {}
    shared = os.environ.get("PGPLANE_SHARED_DIR")
    if shared:
        env["shared_dir"] = Path(shared).expanduser()
    key_file = os.environ.get("PGPLANE_ARCHIVE_KEY_FILE")
    if key_file:
        env["archive_key_file"] = Path(key_file).expanduser()
    bins = os.environ.get("PGPLANE_PG_BIN_DIRS")
    if bins:
        env["pg_bin_dirs"] = tuple(Path(p) for p in bins.split(os.pathsep) if p)
    return env


def _check_store(settings: Settings) -> None:
    """None (SQLite in the data directory) or a PostgreSQL URL, never echoed: it may hold a
    password; and a pool of at least one connection."""
    url = settings.store
    if url is not None and not url.startswith(("postgresql://", "postgres://")):
        raise ValueError("PGPLANE_STORE/--store: expected a postgresql:// URL")
    if settings.store_pool_size < 1:
        raise ValueError("PGPLANE_STORE_POOL_SIZE: at least 1 connection")


def _check_object_store(settings: Settings) -> None:
    """An ``s3://`` URL with its archive key, alone: the shared directory is the other way to
    keep data off this disk."""
    url = settings.object_store
    if url is None:
        if settings.archive_key_file is not None:
            raise ValueError("--archive-key-file goes with --object-store")
        if settings.archive_sync:
            raise ValueError("--archive-sync (PGPLANE_ARCHIVE_SYNC) goes with --object-store")
        return
    if not url.startswith("s3://"):
        raise ValueError("PGPLANE_OBJECT_STORE/--object-store: expected s3://BUCKET/PREFIX")
    if settings.archive_key_file is None:
        raise ValueError(
            "--object-store needs --archive-key-file (PGPLANE_ARCHIVE_KEY_FILE): every object"
            " is sealed with keys derived from it"
        )
    if settings.shared_dir is not None:
        raise ValueError("--object-store and --shared-dir: choose one")
    if settings.object_ship_seconds <= 0 or settings.store_copy_seconds <= 0:
        raise ValueError("PGPLANE_OBJECT_SHIP_SECONDS and PGPLANE_STORE_COPY_SECONDS: above 0")
    if settings.object_history_seconds <= 0:
        raise ValueError("PGPLANE_OBJECT_HISTORY_SECONDS: above 0")
    if settings.backup_verify_seconds < 0:
        raise ValueError("PGPLANE_BACKUP_VERIFY_SECONDS: 0 (never) or above")
