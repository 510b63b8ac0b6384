"""Compute units as Postgres settings: what a compute of N CU may use on this machine.

A Neon compute unit is about 1 vCPU and 4 GB of RAM. Locally there is no VM to size and no
autoscaling, so the size becomes the settings that bound what one postmaster takes: connections
and memory, derived from the maximum CU (the size the compute may reach).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pgplane.compute.driver import ComputeError

_GIB = 1024**3
_RAM_PER_CU = 4 * _GIB
# Neon's table of max_connections by compute size (112 at 0.25 CU, 450 at 1 CU, 901 at 2 CU,
# 1802 at 4 CU, 4000 from 9 CU on) is the compute's RAM divided by this many bytes.
_RAM_PER_CONNECTION = 9_531_392
_MAX_CONNECTIONS = 4000
_MIN_CONNECTIONS = 25
_KB = 1024


def cu_settings(max_cu: float) -> dict[str, str]:
    """The Postgres settings of a compute that may grow to ``max_cu`` compute units.

    - ``max_connections``: Neon's published table (RAM / ~9.1 MB), at least 25, at most 4000;
    - ``shared_buffers``: 128 MB per CU (Postgres' own default at 1 CU), so 32 MB at 0.25 CU;
    - ``effective_cache_size``: 3 GB per CU, the share of RAM the OS cache may hold;
    - ``maintenance_work_mem``: 64 MB per CU, at least 16 MB;
    - ``work_mem``: 4 MB (Postgres' default; it is per sort, not per compute).
    """
    if not (math.isfinite(max_cu) and max_cu > 0):
        raise ComputeError(f"invalid compute size {max_cu!r} CU: expected a positive number")
    ram = max_cu * _RAM_PER_CU
    connections = int(ram // _RAM_PER_CONNECTION)
    return {
        "max_connections": str(min(_MAX_CONNECTIONS, max(_MIN_CONNECTIONS, connections))),
        "shared_buffers": _size_kb(max_cu * 128 * _KB),
        "effective_cache_size": _size_kb(max_cu * 3 * _KB * _KB),
        "maintenance_work_mem": _size_kb(max(16 * _KB, max_cu * 64 * _KB)),
        "work_mem": "4MB",
    }


def compute_settings(max_cu: float, pg_settings: Mapping[str, str]) -> dict[str, str]:
    """The settings derived from the size, overridden by the endpoint's own ``pg_settings``.

    Setting names are case-insensitive in Postgres, so a user's ``Shared_Buffers`` replaces the
    derived ``shared_buffers`` rather than following it on the command line.
    """
    overridden = {name.lower() for name in pg_settings}
    derived = {k: v for k, v in cu_settings(max_cu).items() if k not in overridden}
    return {**derived, **pg_settings}


def _size_kb(kb: float) -> str:
    """A memory size as Postgres reads it: whole MB when it is one, else kB."""
    whole = int(kb)
    return f"{whole // _KB}MB" if whole % _KB == 0 else f"{whole}kB"
