"""A load on a running server: many clients polling operations while branches come and go.

Shared by the load tests (what must hold: no 5xx, every operation settled, memory flat; with the
rate limits on, no 429 either) and the load benchmark (how fast POSTs are answered meanwhile).
The pollers are asyncio tasks in a process of their own: 200 of them keep a Python client busy
enough that its own scheduling would show in latencies measured beside them (measured: a poller's
p99 900 ms while an independent client saw 22 ms), so the branch churn, whose POSTs are timed,
runs alone in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from pgplane.config import Settings
from tests.support import Api, Server, running_server

# How long the churn waits for one of its operations before it notes an error and goes on.
SETTLE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Watch:
    """What one poller reads: an operation of a project, with a key of the project's account."""

    key: str
    project_id: str
    operation_id: str


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
    server: Server,
    api: Api,
    *,
    seconds: float,
    clients: int = 0,
    watches: Sequence[Watch] = (),
    poll_every: float = 1.0,
    branch_every: float = 0.0,
    settle_every: float = 0.05,
) -> LoadResult:
    """Pollers, each reading its operation every ``poll_every`` seconds, while one client creates
    and deletes branches (one in three with a compute) in a project of ``api``'s account, for
    ``seconds``: ``clients`` pollers of that project with ``api``'s key, and one per ``watches``.

    A branch is created every ``branch_every`` seconds (0: as soon as the last one is deleted);
    the brancher polls its operations every ``settle_every`` seconds until they settle.
    """
    project = api.create_ready_project(name="load")
    pid, seed = project["project"]["id"], project["operations"][0]["id"]
    pollers = [Watch(api.key, pid, seed)] * clients + list(watches)
    spawn = multiprocessing.get_context("spawn")
    with spawn.Pool(1) as pool:
        polled = pool.apply_async(poll, (server.base_url, pollers, seconds, poll_every))
        headers = {"Authorization": f"Bearer {api.key}"}
        async with httpx.AsyncClient(base_url=server.base_url, headers=headers, timeout=60) as http:
            load = _Load(http, pid, time.monotonic() + seconds, settle_every)
            assert server.process is not None
            await asyncio.gather(load.brancher(branch_every), load.sampler(server.process.pid))
        statuses, load.result.poll_ms = polled.get(timeout=seconds + 120)
    for status, n in statuses.items():
        load.result.statuses[status] = load.result.statuses.get(status, 0) + n
    return load.result


def account_keys(server: Server, account: str, n: int) -> list[str]:
    """``n`` keys of one account: the first made with the CLI, as a first key is, the others with
    the API and that key (the CLI takes a process and ~0.25 s a key; the API, milliseconds)."""
    _, first = server.create_key(account)
    keys = [first]
    with Api(server, first) as api:
        for i in range(1, n):
            r = api.http.post("/api_keys", json={"key_name": f"poller-{i}"})
            assert r.status_code == 200, r.text
            keys.append(r.json()["key"])
    return keys


def polling_accounts(
    server: Server, *, accounts: int, keys_per_account: int, settle_every: float
) -> list[Watch]:
    """Accounts, each with a project and keys; one poller per key, reading its project's first
    operation. The projects are created together, their operations polled every
    ``settle_every`` seconds."""
    made = []
    for a in range(accounts):
        keys = account_keys(server, f"poller{a}@example.com", keys_per_account)
        with Api(server, keys[0]) as api:
            made.append((keys, api.create_project(name=f"polled-{a}")))
    by_account = []
    for keys, body in made:
        pid, op_ids = body["project"]["id"], [o["id"] for o in body["operations"]]
        with Api(server, keys[0]) as api:
            ops = api.wait_operations(pid, op_ids, every=settle_every)
        assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
        by_account.append([Watch(key, pid, op_ids[0]) for key in keys])
    # Interleaved, so that each account's pollers are spread evenly over the polling interval.
    return [w for group in zip(*by_account, strict=True) for w in group]


_DEFAULTS = Settings()
# What a deployment runs with (the test server turns the limits off unless told).
DEFAULT_LIMITS = {
    "PGPLANE_RATE_LIMIT_PER_MINUTE": str(_DEFAULTS.rate_limit_per_minute),
    "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": str(_DEFAULTS.rate_limit_burst_per_second),
    "PGPLANE_AUTH_FAILURES_PER_MINUTE": str(_DEFAULTS.auth_failures_per_minute),
}

# Scenario C5. Its clients poll as the contract suggests, every 5 s: 200 of them make 40 requests
# a second, 2,400 a minute, more than one account may (700). So they are five accounts' clients,
# 40 keys each (480 requests a minute per account, 8 a second on its busiest route), each account
# polling a project of its own. The churn, 20 branch creations a minute as in the scenario, is a
# sixth account's, which waits for its operations polling every 0.25 s, as a careful client does.
C5_ACCOUNTS, C5_KEYS_PER_ACCOUNT, C5_POLL_EVERY = 5, 40, 5.0
C5_BRANCH_EVERY, C5_SETTLE_EVERY = 60 / 20, 0.25


@contextlib.contextmanager
def c5_platform() -> Iterator[tuple[Server, Api, list[Watch]]]:
    """A server at the default limits, C5's polling accounts, and the churning account's client."""
    with running_server(**DEFAULT_LIMITS) as server:
        watches = polling_accounts(
            server,
            accounts=C5_ACCOUNTS,
            keys_per_account=C5_KEYS_PER_ACCOUNT,
            settle_every=C5_SETTLE_EVERY,
        )
        _, key = server.create_key("churn@example.com")
        with Api(server, key) as api:
            yield server, api, watches


async def run_c5(server: Server, api: Api, watches: list[Watch], seconds: float) -> LoadResult:
    return await run_load(
        server,
        api,
        watches=watches,
        seconds=seconds,
        poll_every=C5_POLL_EVERY,
        branch_every=C5_BRANCH_EVERY,
        settle_every=C5_SETTLE_EVERY,
    )


def unused_keys(server: Server, watches: list[Watch]) -> list[dict]:
    """The pollers' keys the server never saw used (``last_used_at`` still null)."""
    keys_of: defaultdict[str, list[str]] = defaultdict(list)
    for watch in watches:
        keys_of[watch.project_id].append(watch.key)
    unused = []
    for keys in keys_of.values():
        with Api(server, keys[0]) as api:
            r = api.http.get("/api_keys")
        assert r.status_code == 200, r.text
        listed = r.json()
        assert len(listed) == len(keys), listed
        unused += [item for item in listed if item["last_used_at"] is None]
    return unused


def poll(
    base_url: str, pollers: list[Watch], seconds: float, poll_every: float
) -> tuple[dict[int, int], list[float]]:
    """The pollers (in their own process): each reads its operation, and every fifth time its
    project's latest ten, every ``poll_every`` seconds, with its own key. Statuses and
    latencies."""
    statuses: dict[int, int] = {}
    latencies: list[float] = []

    async def main() -> None:
        deadline = time.monotonic() + seconds
        clients = len(pollers)
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:

            async def poller(watch: Watch, phase: float) -> None:
                await asyncio.sleep(poll_every * phase)  # spread over the interval
                headers = {"Authorization": f"Bearer {watch.key}"}
                path = f"/projects/{watch.project_id}/operations"
                for n in itertools.count():
                    if time.monotonic() >= deadline:
                        return
                    t0 = time.perf_counter()
                    if n % 5 == 4:
                        r = await http.get(path, params={"limit": 10}, headers=headers)
                    else:
                        r = await http.get(f"{path}/{watch.operation_id}", headers=headers)
                    latencies.append((time.perf_counter() - t0) * 1000)
                    statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                    await asyncio.sleep(poll_every)

            await asyncio.gather(
                *(poller(watch, n / max(1, clients)) for n, watch in enumerate(pollers))
            )

    asyncio.run(main())
    return statuses, latencies


class _Load:
    def __init__(
        self, http: httpx.AsyncClient, pid: str, deadline: float, settle_every: float
    ) -> None:
        self.http = http
        self.pid = pid
        self.deadline = deadline
        self.settle_every = settle_every
        self.result = LoadResult()

    async def settle(self, op_ids: list[str]) -> None:
        give_up = time.monotonic() + SETTLE_TIMEOUT
        for op_id in op_ids:
            while True:
                if time.monotonic() > give_up:
                    self.result.errors.append(
                        f"operation {op_id} unsettled after {SETTLE_TIMEOUT} s"
                    )
                    return
                r = await self.http.get(f"/projects/{self.pid}/operations/{op_id}")
                self.result.count(r.status_code)
                if r.status_code != 200:
                    self.result.errors.append(f"GET operation {op_id}: {r.status_code} {r.text}")
                    return
                op = r.json()["operation"]
                if op["status"] == "failed":
                    self.result.errors.append(str(op))
                if op["status"] in ("finished", "failed"):
                    break
                await asyncio.sleep(self.settle_every)

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

    async def brancher(self, every: float) -> None:
        start = time.monotonic()
        for n in itertools.count():
            await asyncio.sleep(max(0.0, start + n * every - time.monotonic()))
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
