"""A load on a running server: many clients polling operations while branches come and go.

Shared by the load test (what must hold: no 5xx, every operation settled, memory flat) and the
load benchmark (how fast POSTs are answered meanwhile). The pollers are asyncio tasks in a process
of their own: 200 of them keep a Python client busy enough that its own scheduling would show in
latencies measured beside them (measured: a poller's p99 900 ms while an independent client saw
22 ms), so the branch churn, whose POSTs are timed, runs alone in this process.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import Api, Server


@dataclass
class LoadResult:
    statuses: dict[int, int] = field(default_factory=dict)
    post_ms: list[float] = field(default_factory=list)
    poll_ms: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)  # the server's, sampled every second
    branches_created: int = 0
    errors: list[str] = field(default_factory=list)

    def count(self, status: int) -> None:
        self.statuses[status] = self.statuses.get(status, 0) + 1

    @property
    def server_errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status >= 500)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run_load(
    server: Server, api: Api, *, clients: int, seconds: float, poll_every: float = 1.0
) -> LoadResult:
    """``clients`` pollers of one project's operations while one client creates and deletes
    branches (one in three with a compute) as fast as they finish, for ``seconds``."""
    project = api.create_ready_project(name="load")
    pid, seed = project["project"]["id"], project["operations"][0]["id"]
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        polled = pool.apply_async(
            poll, (server.base_url, api.key, pid, seed, clients, seconds, poll_every)
        )
        headers = {"Authorization": f"Bearer {api.key}"}
        async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60) as http:
            load = _Load(http, pid, time.monotonic() + seconds)
            assert server.process is not None
            await asyncio.gather(load.brancher(), load.sampler(server.process.pid))
        statuses, load.result.poll_ms = polled.get(timeout=seconds + 120)
    for status, n in statuses.items():
        load.result.statuses[status] = load.result.statuses.get(status, 0) + n
    return load.result


def poll(
    base_url: str,
    key: str,
    pid: str,
    seed: str,
    clients: int,
    seconds: float,
    poll_every: float,
) -> tuple[dict[int, int], list[float]]:
    """The pollers (in their own process): each reads an operation, and every fifth time the
    project's latest ten, every ``poll_every`` seconds. Statuses and latencies."""
    statuses: dict[int, int] = {}
    latencies: list[float] = []

    async def main() -> None:
        deadline = time.monotonic() + seconds
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        headers = {"Authorization": f"Bearer {key}"}
        async with httpx.AsyncClient(
            base_url=base_url, headers=headers, timeout=60, limits=limits
        ) as http:

            async def poller(phase: float) -> None:
                await asyncio.sleep(poll_every * phase)  # spread over the interval
                for n in itertools.count():
                    if time.monotonic() >= deadline:
                        return
                    path = f"/projects/{pid}/operations"
                    t0 = time.perf_counter()
                    if n % 5 == 4:
                        r = await http.get(path, params={"limit": 10})
                    else:
                        r = await http.get(f"{path}/{seed}")
                    latencies.append((time.perf_counter() - t0) * 1000)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    await asyncio.sleep(poll_every)

            await asyncio.gather(*(poller(n / max(1, clients)) for n in range(clients)))

    asyncio.run(main())
    return statuses, latencies


class _Load:
    def __init__(self, http: httpx.AsyncClient, pid: str, deadline: float) -> None:
        self.http = http
        self.pid = pid
        self.deadline = deadline
        self.result = LoadResult()

    async def settle(self, op_ids: list[str]) -> None:
        for op_id in op_ids:
            while True:
                op = (await self.http.get(f"/projects/{self.pid}/operations/{op_id}")).json()
                status = op["operation"]["status"]
                if status == "failed":
                    self.result.errors.append(str(op["operation"]))
                if status in ("finished", "failed"):
                    break
                await asyncio.sleep(0.05)

    async def post(self, method: str, path: str, **kwargs: object) -> httpx.Response | None:
        """A timed POST/DELETE; None (and an error noted) unless it was accepted."""
        t0 = time.perf_counter()
        r = await self.http.request(method, path, **kwargs)  # type: ignore[arg-type]
        self.result.post_ms.append((time.perf_counter() - t0) * 1000)
        self.result.count(r.status_code)
        if r.status_code not in (200, 201):
            self.result.errors.append(f"{method} {path}: {r.status_code} {r.text}")
            return None
        await self.settle([o["id"] for o in r.json()["operations"]])
        return r

    async def brancher(self) -> None:
        for n in itertools.count():
            if time.monotonic() >= self.deadline:
                return
            endpoints = [{"type": "read_write"}] if n % 3 == 0 else []
            body = {"branch": {"name": f"load-{n}"}, "endpoints": endpoints}
            created = await self.post("POST", f"/projects/{self.pid}/branches", json=body)
            if created is None:
                continue
            self.result.branches_created += 1
            branch_id = created.json()["branch"]["id"]
            await self.post("DELETE", f"/projects/{self.pid}/branches/{branch_id}")

    async def sampler(self, server_pid: int) -> None:
        while time.monotonic() < self.deadline:
            self.result.rss_mb.append(rss_mb(server_pid))
            await asyncio.sleep(1)
