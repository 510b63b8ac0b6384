"""Threads that wait on a tenant's processes, apart from the platform's own.

``pg_dump`` (a schema read) and ``psql`` (a schema-only branch's restore) run as the project's
OS user and end when the tenant's server lets them: a lock it holds, an answer it delays, up to
their time limits (a minute, ten). They cannot be awaited as child processes (uvloop starts no
child as another user), so a thread waits on each. In the default pool, six schema reads of
one account, each waiting on a table that account kept locked, held every thread there: the
platform's own blocking work (a wake's file reads, every account's) waited behind them.

They wait here instead: a pool of their own, and at most :data:`PER_TENANT` of one tenant's (an
OS user: a project's own when computes are walled) at once, the rest waiting their turn. One
tenant never holds more than that of the pool, and never a thread of the platform's.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from pgplane.compute.local.tenants.user import RunAs
from pgplane.core.turns import Turns

P = ParamSpec("P")
T = TypeVar("T")

THREADS = 16
PER_TENANT = 2

_pool = ThreadPoolExecutor(THREADS, thread_name_prefix="pgplane-tenant-wait")
_turns = Turns(PER_TENANT)


async def wait_on(run_as: RunAs, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)`` in the tenants' pool, one of ``run_as``'s :data:`PER_TENANT`.

    Without root every project runs as the same user: then only the pool bounds them (such a
    platform walls no tenant off anyway)."""
    call = functools.partial(fn, *args, **kwargs)
    loop = asyncio.get_running_loop()
    if not run_as.switch:
        return await loop.run_in_executor(_pool, call)
    async with _turns.turn(run_as.name):
        return await loop.run_in_executor(_pool, call)
