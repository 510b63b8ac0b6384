"""The console under load: time to first byte of a project's page and of its operations fragment,
beside the API's ``GET …/operations``, in the same run.

On a real ``pgplane serve``, two phases: idle, then under the load of ``bench/load.py`` (200
pollers of operations while branches are created and deleted). In each, one client (signed in
to the console, and with a key of the same account) reads the three in turn, one request at a
time, and times each to its first byte. Printed: p50/p99 of each, and each console page's p50
as a multiple of the API's. Target: every answer a 200.

    .venv/bin/python -m bench.console [--clients 200] [--seconds 60] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx
from tests.console import PASSWORD, Browser, root
from tests.load import run_load
from tests.support import run_cli

from bench.common import (
    Api,
    Server,
    median,
    parse_with_smoke,
    percentile,
    running_server,
    verdict,
)

NO_LIMITS = {"PGPLANE_RATE_LIMIT_PER_MINUTE": "0", "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0"}
EMAIL = "bench@example.com"
FRAGMENT = {"X-Pgplane-Fragment": "1"}


async def sample(
    server: Server, key: str, session: str, pid: str, seconds: float
) -> tuple[dict[str, list[float]], set[int]]:
    """Time each target to its first byte, in turn, for ``seconds``."""
    targets = {
        "API GET …/operations": (f"/api/v2/projects/{pid}/operations", {"Authorization": f"Bearer {key}"}),
        "console project page": (f"/console/projects/{pid}", {}),
        "console operations fragment": (f"/console/projects/{pid}/operations/", FRAGMENT),
    }  # fmt: skip
    ms: dict[str, list[float]] = {name: [] for name in targets}
    statuses: set[int] = set()
    cookies = {"pgplane_session": session}
    async with httpx.AsyncClient(base_url=root(server), cookies=cookies, timeout=60) as http:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name, (path, headers) in targets.items():
                started = time.perf_counter()
                async with http.stream("GET", path, headers=headers) as response:
                    async for _ in response.aiter_raw():
                        break
                    ms[name].append((time.perf_counter() - started) * 1000)
                    statuses.add(response.status_code)
    return ms, statuses


def report(phase: str, ms: dict[str, list[float]]) -> None:
    api = median(next(iter(ms.values())))
    for name, values in ms.items():
        print(
            f"{phase:7s} {name:28s} p50 {median(values):6.1f} ms  p99"
            f" {percentile(values, 0.99):6.1f} ms  ({median(values) / api:4.1f}x the API's p50,"
            f" {len(values)} requests)"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60)
    args = parse_with_smoke(parser, clients=5, seconds=2.0)
    with running_server(**NO_LIMITS) as server:
        done = run_cli(
            "accounts", "create", EMAIL, "--password-stdin",
            data_dir=server.data_dir, stdin=PASSWORD,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        _, key = server.create_key(EMAIL)
        with Api(server, key) as api, Browser(server) as browser:
            pid = api.create_ready_project(name="console")["project"]["id"]
            assert browser.sign_in(EMAIL).status_code == 303
            session = browser.session or ""
            idle, idle_statuses = asyncio.run(
                sample(server, key, session, pid, min(20, args.seconds))
            )

            async def loaded() -> tuple[dict[str, list[float]], set[int]]:
                load = run_load(server, api, clients=args.clients, seconds=args.seconds)
                _, measured = await asyncio.gather(
                    load, sample(server, key, session, pid, args.seconds)
                )
                return measured

            busy, busy_statuses = asyncio.run(loaded())
    print(f"time to first byte, one request at a time; load: {args.clients} pollers + branch churn")
    report("idle", idle)
    report("loaded", busy)
    checks = {"every answer a 200": idle_statuses | busy_statuses == {200}}
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
