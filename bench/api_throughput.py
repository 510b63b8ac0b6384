"""Authenticated ``GET /projects/{id}/operations?limit=10`` vs a bare Starlette hello.

Both served by one uvicorn process (httptools, uvloop) on this machine, loaded by wrk with 64
connections on one thread (with two, wrk and the server fight over this machine's two cores and
the tail measures the scheduler), in the same run: interleaved rounds, medians reported. Target:
at least 5,000 requests/s with p99 under 15 ms where the baseline does 33k/s; the script also
scales the target to the baseline.

pgplane runs twice: with the rate limits off, and on with limits set beyond what wrk reaches
(every request pays for the checks, none is refused); the ratio of the two is their cost. The
target is judged with the limits on, the path every request takes in production.

    .venv/bin/python -m bench.api_throughput [--seconds 10] [--rounds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from bench.common import Server, free_port, median, parse_with_smoke, running_server, verdict, wrk

REFERENCE_BASELINE_RPS = 33_000  # the bare Starlette hello where the targets were set


@contextlib.contextmanager
def starlette_hello() -> Iterator[str]:
    """The baseline: a bare Starlette hello served by the same uvicorn configuration."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "bench.hello_starlette:app", "--port", str(port),
         "--http", "httptools", "--loop", "uvloop", "--log-level", "warning", "--no-access-log"],
    )  # fmt: skip
    try:
        for _ in range(200):
            try:
                httpx.get(f"http://127.0.0.1:{port}/")
                break
            except httpx.TransportError:
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait()


LIMITS_OFF = {
    "PGPLANE_RATE_LIMIT_PER_MINUTE": "0",
    "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "0",
    "PGPLANE_AUTH_FAILURES_PER_MINUTE": "0",
}
LIMITS_ON = {  # checked on every request, never reached by one key at wrk's rate
    "PGPLANE_RATE_LIMIT_PER_MINUTE": "1000000000",
    "PGPLANE_RATE_LIMIT_BURST_PER_SECOND": "1000000000",
    "PGPLANE_AUTH_FAILURES_PER_MINUTE": "50",
}


def operations_page(server: Server) -> tuple[str, dict[str, str]]:
    """A project with a full page of ten operations: the URL and the headers that read it."""
    _, key = server.create_key("bench@example.com")
    headers = {"Authorization": f"Bearer {key}"}
    created = httpx.post(
        f"{server.base_url}/projects", json={"project": {"name": "bench"}}, headers=headers
    ).json()
    pid = created["project"]["id"]
    for i in range(12):
        httpx.patch(
            f"{server.base_url}/projects/{pid}",
            json={"project": {"history_retention_seconds": 100 + i}},
            headers=headers,
        )
    url = f"{server.base_url}/projects/{pid}/operations?limit=10"
    page = httpx.get(url, headers=headers).json()
    assert len(page["operations"]) == 10, page
    return url, headers


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parse_with_smoke(parser, seconds=1, rounds=1)

    with (
        running_server(**LIMITS_OFF) as off,
        running_server(**LIMITS_ON) as on,
        starlette_hello() as hello_url,
    ):
        off_url, off_headers = operations_page(off)
        on_url, on_headers = operations_page(on)
        time.sleep(2)  # let the operations settle so the engines are idle
        # Interleaved rounds, medians reported: this machine's neighbours come and go, and a
        # burst of stolen CPU in one run moves its p99 by tens of milliseconds.
        bases, offs, ons = [], [], []
        for _ in range(args.rounds):
            bases.append(wrk(hello_url, connections=64, seconds=args.seconds))
            offs.append(wrk(off_url, connections=64, seconds=args.seconds, headers=off_headers))
            ons.append(wrk(on_url, connections=64, seconds=args.seconds, headers=on_headers))

    for name, runs in (
        ("bare Starlette hello", bases),
        ("pgplane, rate limits off", offs),
        ("pgplane, rate limits on", ons),
    ):
        each = ", ".join(f"{r.requests_per_second:.0f}/s p99 {r.p99_ms:.1f}" for r in runs)
        print(f"{name + ':':34} {each}")
    base_rps = median([r.requests_per_second for r in bases])
    off_rps = median([r.requests_per_second for r in offs])
    rps = median([r.requests_per_second for r in ons])
    p50 = median([r.p50_ms for r in ons])
    p99 = median([r.p99_ms for r in ons])
    non_2xx = sum(r.non_2xx for r in ons) + sum(r.non_2xx for r in offs)
    print(f"median bare Starlette hello:       {base_rps:9.0f} req/s")
    print(f"median pgplane, limits off:        {off_rps:9.0f} req/s")
    print(
        f"median pgplane, limits on:         {rps:9.0f} req/s   p50 {p50:6.2f} ms   "
        f"p99 {p99:6.2f} ms   (non-2xx: {non_2xx})"
    )
    print(f"ratio limits on / off:             {rps / off_rps:9.3f}")
    print(f"ratio pgplane / baseline:          {rps / base_rps:9.2f}")
    # The target was set on a machine where this baseline does about 33k req/s; on a slower or
    # busier one, scale it by the baseline measured just now.
    scale = base_rps / REFERENCE_BASELINE_RPS
    want_rps, want_p99 = 5000 * scale, 15 / scale
    unscaled = rps >= 5000 and p99 < 15
    print(
        f"as absolute figures (>= 5000 req/s, p99 < 15 ms): {'met' if unscaled else 'NOT met'}"
        " (not judged: the machine's speed is)"
    )
    return verdict(
        {
            f"scaled to this machine ({scale:.2f}x the reference): >= {want_rps:.0f} req/s,"
            f" p99 < {want_p99:.1f} ms, all 2xx": rps >= want_rps
            and p99 < want_p99
            and non_2xx == 0
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
