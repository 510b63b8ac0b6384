"""The process's descriptor limit: raised to the hard limit at start-up, and the listeners'
connection caps sized under it.

The hazard: every client connection holds a descriptor, and so does everything else the process
does (the store's files, the engine's admin sessions on computes, the pipes of the postmasters it
starts, log files). Once connections take them all, ``accept`` fails with EMFILE and, worse, so
does the engine's next store or compute connection: one flood stopped the whole platform. So the
soft limit goes up to the hard one (the default soft limit, often 1024, is a relic of
``select()``; the process waits on epoll), and the caps are cut down where they would not leave a
reserve for the rest.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

from pgplane.config import Settings
from pgplane.connlimits import ConnectionGate

log = logging.getLogger("pgplane")

# Kept for everything but client connections: the store, admin sessions, postmasters' pipes,
# logs, the listeners themselves. An eighth of the limit, never below this.
RESERVE_MIN = 256
# Where the hard limit is "unlimited" (not on Linux, whose hard limit is at most fs.nr_open).
_UNLIMITED = 1 << 20


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; return it before and after."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):  # a hard limit the kernel will not grant (macOS's OPEN_MAX)
        return soft, soft
    return soft, target


@dataclass(frozen=True, slots=True)
class Caps:
    """Connection caps of the two listeners (0 per address: no per-address cap)."""

    api_total: int
    api_per_address: int
    proxy_total: int
    proxy_per_address: int

    @property
    def descriptors(self) -> int:
        """Descriptors the listeners may hold at most: a proxied client holds two, its own and
        its compute's."""
        return self.api_total + 2 * self.proxy_total


def reserve(limit: int) -> int:
    """Descriptors kept for everything but client connections under ``limit``."""
    return max(RESERVE_MIN, limit // 8)


def size_caps(limit: int, wanted: Caps) -> Caps:
    """``wanted`` (a total of 0: as many as the limit allows), cut down in proportion where the
    listeners together would eat into :func:`reserve`."""
    budget = max(0, limit - reserve(limit))
    api_total = wanted.api_total or budget
    proxy_total = wanted.proxy_total or budget // 2
    need = api_total + 2 * proxy_total
    if need > budget:
        api_total = max(1, api_total * budget // need)
        proxy_total = max(1, proxy_total * budget // need)
    return Caps(
        api_total=api_total,
        api_per_address=min(wanted.api_per_address, api_total),
        proxy_total=proxy_total,
        proxy_per_address=min(wanted.proxy_per_address, proxy_total),
    )


def gates(settings: Settings) -> tuple[ConnectionGate, ConnectionGate]:
    """The API's and the proxy's connection gates, under a descriptor limit raised to the hard
    one first (the module says why); SystemExit for a cap or deadline set below 0."""
    for name in (
        "api_max_connections",
        "api_connections_per_address",
        "proxy_max_connections",
        "proxy_connections_per_address",
        "http_header_timeout_seconds",
        "http_body_timeout_seconds",
        "proxy_handshake_timeout_seconds",
    ):
        if getattr(settings, name) < 0:
            raise SystemExit(f"pgplane: PGPLANE_{name.upper()} must not be negative")
    before, limit = raise_nofile()
    if limit != before:
        log.info("descriptor limit raised from %d to %d", before, limit)
    wanted = Caps(
        api_total=settings.api_max_connections,
        api_per_address=settings.api_connections_per_address,
        proxy_total=settings.proxy_max_connections,
        proxy_per_address=settings.proxy_connections_per_address,
    )
    caps = size_caps(limit, wanted)
    log.info(
        "connection caps: API %d (%d per address), proxy %d (%d per address);"
        " descriptor limit %d, %d kept in reserve",
        *(caps.api_total, caps.api_per_address, caps.proxy_total, caps.proxy_per_address),
        *(limit, reserve(limit)),
    )
    if wanted.api_total and wanted.proxy_total and caps.descriptors < wanted.descriptors:
        log.warning(
            "connection caps cut down to fit the descriptor limit %d: raise its hard limit"
            " (ulimit -Hn, systemd's LimitNOFILE=) for the caps asked for",
            limit,
        )
    return (
        ConnectionGate(per_address=caps.api_per_address, total=caps.api_total),
        ConnectionGate(per_address=caps.proxy_per_address, total=caps.proxy_total),
    )
