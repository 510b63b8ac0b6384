"""API latency under load: 200 clients polling operations while branches are created and deleted.

On a real ``pgplane serve`` (the load of ``tests/load.py``), two phases in one run:

- **baseline**: the same branch churn with no pollers: POST latency of create and delete;
- **loaded**: the churn while ``--clients`` pollers each read an operation every ``--poll``
  seconds, for ``--seconds``.

Reported: POST p50/p99 in both phases and their ratio, GET p50/p99 under load, 5xx count,
operations that did not settle, and the server's RSS over the loaded phase (first vs last
quarter). Target: POST p99 under load < 50 ms, no 5xx, every operation settled, memory flat.
Rate limits are turned off: this measures the platform, not the limiter.

With ``--c5``, scenario C5 instead (the load of ``tests/e2e/test_load.py``'s C5 test): 200
clients, each with a key of its own (five accounts, each polling its own project), reading an
operation every 5 s, while a sixth account creates 20 branches a minute, at the default rate
limits. Targets: POST p99 < 1 s, GET p99 < 200 ms, no 5xx, no 429, every operation settled.

    .venv/bin/python -m bench.load [--clients 200] [--seconds 180] [--poll 1.0] [--smoke]
    .venv/bin/python -m bench.load --c5 [--seconds 300]
"""

from __future__ import annotations

import argparse
import asyncio

from tests.conftest import assert_operations_settled
from tests.load import LoadResult, c5_platform, run_c5, run_load, unused_keys

from bench.common import Api, median, parse_with_smoke, percentile, running_server, verdict

NO_LIMITS = {"PGPLANE_RATE_LIMIT_PER_MINUTE": "0", "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0"}


def report(name: str, result: LoadResult) -> None:
    posts, polls = result.post_ms, result.poll_ms
    print(
        f"{name:9s} POST p50 {median(posts):6.1f} ms  p99 {percentile(posts, 0.99):6.1f} ms"
        f"  ({len(posts)} POSTs, {result.branches_created} branches)"
    )
    if polls:
        print(
            f"{'':9s} GET  p50 {median(polls):6.1f} ms  p99 {percentile(polls, 0.99):6.1f} ms"
            f"  ({len(polls)} GETs, {len(polls) / max(1, len(result.rss_mb)):.0f}/s)"
        )


def c5(seconds: float) -> int:
    with c5_platform() as (server, api, watches):
        result = asyncio.run(run_c5(server, api, watches, seconds))
        try:
            assert_operations_settled(server, timeout=60)
            unsettled = ""
        except AssertionError as exc:
            unsettled = str(exc)
        unused = unused_keys(server, watches)
    report("C5", result)
    print(f"{len(watches)} keys, {len(unused)} never used")
    print(f"statuses: {dict(sorted(result.statuses.items()))}")
    checks = {
        "POST p99 < 1 s": percentile(result.post_ms, 0.99) < 1000,
        "GET p99 < 200 ms": percentile(result.poll_ms, 0.99) < 200,
        "no 5xx": result.server_errors == 0,
        "no 429": 429 not in result.statuses,
        "every operation settled": not unsettled and not result.errors,
        "every key used": not unused,
    }
    for problem in [unsettled, *result.errors[:5]]:
        if problem:
            print("problem:", problem)
    return verdict(checks)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=180)
    parser.add_argument("--poll", type=float, default=1.0)
    parser.add_argument("--c5", action="store_true", help="scenario C5 (see above)")
    args = parse_with_smoke(parser, clients=10, seconds=3.0)
    if args.c5:
        return c5(args.seconds)
    env = {**NO_LIMITS, "PGPLANE_KEY_USE_FLUSH_SECONDS": "5"}
    with running_server(**env) as server:
        _, key = server.create_key("load@example.com")
        with Api(server, key) as api:
            base = asyncio.run(run_load(server, api, clients=0, seconds=min(30, args.seconds)))
            loaded = asyncio.run(
                run_load(
                    server, api, clients=args.clients, seconds=args.seconds, poll_every=args.poll
                )
            )
            # Read from the store: operations no client polled count too.
            try:
                assert_operations_settled(server, timeout=60)
                unsettled = ""
            except AssertionError as exc:
                unsettled = str(exc)
    report("baseline", base)
    report("loaded", loaded)
    ratio = percentile(loaded.post_ms, 0.99) / percentile(base.post_ms, 0.99)
    quarter = max(1, len(loaded.rss_mb) // 4)
    first, last = max(loaded.rss_mb[:quarter]), max(loaded.rss_mb[-quarter:])
    print(f"POST p99 loaded/baseline: {ratio:.2f}x")
    print(f"5xx: {loaded.server_errors}   statuses: {dict(sorted(loaded.statuses.items()))}")
    print(f"server RSS: {first:.0f} MB (first quarter) -> {last:.0f} MB (last quarter)")
    checks = {
        "POST p99 < 50 ms": percentile(loaded.post_ms, 0.99) < 50,
        "no 5xx": loaded.server_errors == 0 and base.server_errors == 0,
        "every operation settled": not unsettled and not loaded.errors,
        "memory flat (< 20 MB growth)": last - first < 20,
    }
    for problem in [unsettled, *loaded.errors[:5]]:
        if problem:
            print("problem:", problem)
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
