"""Authenticated ``GET /projects/{id}/operations?limit=10`` vs a bare Starlette hello.

Both served by one uvicorn process (httptools, uvloop) on this machine, loaded by wrk with 64
connections on one thread (with two, wrk and the server fight over this machine's two cores and
the tail measures the scheduler), in the same run: interleaved rounds, medians reported. Target:
at least 5,000 requests/s with p99 under 15 ms where the baseline does 33k/s; the script also
scales the target to the baseline.

    .venv/bin/python -m bench.api_throughput [--seconds 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx

from bench.common import free_port, median, running_server, wrk

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    with running_server() as server, starlette_hello() as hello_url:
        _, key = server.create_key("bench@example.com")
        headers = {"Authorization": f"Bearer {key}"}
        created = httpx.post(
            f"{server.base_url}/projects", json={"project": {"name": "bench"}}, headers=headers
        ).json()
        pid = created["project"]["id"]
        for i in range(12):  # a full page of ten operations
            httpx.patch(
                f"{server.base_url}/projects/{pid}",
                json={"project": {"history_retention_seconds": 100 + i}},
                headers=headers,
            )
        url = f"{server.base_url}/projects/{pid}/operations?limit=10"
        page = httpx.get(url, headers=headers).json()
        assert len(page["operations"]) == 10, page
        time.sleep(2)  # let the operations settle so the engine is idle
        # Interleaved rounds, medians reported: this machine's neighbours come and go, and a
        # burst of stolen CPU in one run moves its p99 by tens of milliseconds.
        bases, ours = [], []
        for _ in range(args.rounds):
            bases.append(wrk(hello_url, connections=64, seconds=args.seconds))
            ours.append(wrk(url, connections=64, seconds=args.seconds, headers=headers))

    for name, runs in (("bare Starlette hello", bases), ("pgplane GET operations?limit=10", ours)):
        each = ", ".join(f"{r.requests_per_second:.0f}/s p99 {r.p99_ms:.1f}" for r in runs)
        print(f"{name + ':':34} {each}")
    base_rps = median([r.requests_per_second for r in bases])
    rps = median([r.requests_per_second for r in ours])
    p50 = median([r.p50_ms for r in ours])
    p99 = median([r.p99_ms for r in ours])
    non_2xx = sum(r.non_2xx for r in ours)
    print(f"median bare Starlette hello:       {base_rps:9.0f} req/s")
    print(
        f"median pgplane:                    {rps:9.0f} req/s   p50 {p50:6.2f} ms   "
        f"p99 {p99:6.2f} ms   (non-2xx: {non_2xx})"
    )
    print(f"ratio pgplane / baseline:          {rps / base_rps:9.2f}")
    # The target was set on a machine where this baseline does about 33k req/s; on a slower or
    # busier one, scale it by the baseline measured just now.
    scale = base_rps / REFERENCE_BASELINE_RPS
    want_rps, want_p99 = 5000 * scale, 15 / scale
    met = rps >= want_rps and p99 < want_p99 and non_2xx == 0
    print(
        f"target, scaled to this machine ({scale:.2f}x the reference): >= {want_rps:.0f} req/s, "
        f"p99 < {want_p99:.1f} ms: {'met' if met else 'NOT met'}"
    )
    unscaled = rps >= 5000 and p99 < 15
    print(
        f"target as absolute figures (>= 5000 req/s, p99 < 15 ms): {'met' if unscaled else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
