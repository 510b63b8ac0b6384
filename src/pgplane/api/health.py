"""Health for load balancers and Kubernetes probes, outside ``/api/v2`` and its keys.

- ``GET /livez``: the process answers HTTP. A failing store does not make it "not live":
  restarting the process would not mend the store, so a liveness probe must not ask about it.
- ``GET /readyz``: the process can do its work. The store serves a read and commits a write,
  and the operations engine and the scheduler are running. Otherwise it answers 503 with the
  error body, ``Retry-After``, and what is wrong.

Probes come unauthenticated and from anywhere; a probe commits a small write. So one check runs
at a time, and its answer is reused for ``REUSE_SECONDS`` (a flood of probes costs one write a
second).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from litestar import MediaType, Request, get
from litestar.datastructures import State

from pgplane.errors import PgplaneError, Unavailable
from pgplane.store import Store

log = logging.getLogger(__name__)

REUSE_SECONDS = 1.0
_RETRY_AFTER = {"Retry-After": "1"}


class Readiness:
    """Whether the platform can do its work: the store, and the background tasks it watches."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._checking: asyncio.Task[dict[str, str]] | None = None
        self._checked_at = 0.0

    def watch(self, name: str, task: asyncio.Task[None]) -> None:
        """Count ``task`` as a part that must keep running (the engine, the scheduler)."""
        self._tasks[name] = task

    async def check(self) -> dict[str, str]:
        """Each part's state, all ``"ok"``; Unavailable saying which are not, and why."""
        now = asyncio.get_running_loop().time()
        if self._checking is None or (
            self._checking.done() and now - self._checked_at >= REUSE_SECONDS
        ):
            self._checking = asyncio.create_task(self._check())
            self._checked_at = now
        # Shielded: a probe that hangs up does not cancel the check others wait for.
        parts = await asyncio.shield(self._checking)
        problems = [f"{name}: {state}" for name, state in parts.items() if state != "ok"]
        if problems:
            raise Unavailable(f"not ready: {'; '.join(problems)}", headers=_RETRY_AFTER)
        return parts

    async def _check(self) -> dict[str, str]:
        parts = {"store": "ok"}
        try:
            await self._store.probe()
        except PgplaneError as exc:
            parts["store"] = exc.message
        except Exception as exc:  # said, not raised: the answer is "not ready", never a 500
            log.exception("the store's readiness probe failed unexpectedly")
            parts["store"] = f"probe failed: {type(exc).__name__}: {exc}"
        for name, task in self._tasks.items():
            parts[name] = "ok" if not task.done() else f"stopped ({_ending(task)})"
        return parts


def _ending(task: asyncio.Task[None]) -> str:
    """How a task that is done ended."""
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    return "returned" if exc is None else f"{type(exc).__name__}: {exc}"


@get("/livez", include_in_schema=False, media_type=MediaType.JSON, sync_to_thread=False)
def live() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@get("/readyz", include_in_schema=False, media_type=MediaType.JSON)
async def ready(request: Request[Any, Any, State]) -> dict[str, Any]:
    """The store reads and writes, and the engine and scheduler run; 503 with the reason if not."""
    readiness: Readiness = request.app.state.readiness
    return {"status": "ok", "checks": await readiness.check()}
