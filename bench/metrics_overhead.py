"""API throughput with metrics on beside metrics off (``PGPLANE_METRICS=off``), in one run.

The workload of bench/api_throughput.py (authenticated ``GET /projects/{id}/operations?limit=10``
under wrk, 64 connections, one thread, the rate limits on as in production) against two servers
started side by side, one with metrics and one without. While the metrics server is loaded, a
scraper reads its ``/metrics`` every second (fifteen times as often as Prometheus' default), so
the cost of being scraped is in the figure too.

This machine is shared, and its neighbours come and go (load averages of 2 to 7 on two cores
while this was written, moving one run's throughput by 2x). So the runs are many and short, in
rounds of one run of each server, adjacent in time and each round starting with the other server
than the last; the target, metrics on at least 0.97x metrics off, is judged on the median of the
rounds' own ratios, which a neighbour's burst moves less than the ratio of two medians.
``--control`` starts both servers with metrics off (unscraped): what it prints is the difference
between two identical servers, the floor below which a figure of the real run is noise.

    .venv/bin/python -m bench.metrics_overhead [--seconds 5] [--rounds 12] [--control] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from collections.abc import Iterator

import httpx

from bench.api_throughput import LIMITS_ON, operations_page
from bench.common import (
    Server,
    WrkResult,
    median,
    parse_with_smoke,
    running_server,
    verdict,
    wrk,
)

TARGET_RATIO = 0.97
SCRAPE_SECONDS = 1.0


@contextlib.contextmanager
def scraping(server: Server) -> Iterator[list[int]]:
    """A scraper reading ``/metrics`` every second until the block ends; yields its byte counts."""
    sizes: list[int] = []
    stop = threading.Event()

    def scrape() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.wait(SCRAPE_SECONDS):
                r = client.get(f"http://127.0.0.1:{server.port}/metrics")
                assert r.status_code == 200, r.text
                sizes.append(len(r.content))

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    try:
        yield sizes
    finally:
        stop.set()
        thread.join()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument(
        "--control",
        action="store_true",
        help="both servers with metrics off, unscraped: the difference two identical servers show",
    )
    args = parse_with_smoke(parser, seconds=1, rounds=1)

    with (
        running_server(**LIMITS_ON, PGPLANE_METRICS="off" if args.control else "on") as on,
        running_server(**LIMITS_ON, PGPLANE_METRICS="off") as off,
    ):
        on_url, on_headers = operations_page(on)
        off_url, off_headers = operations_page(off)
        assert httpx.get(f"http://127.0.0.1:{off.port}/metrics").status_code == 404
        wrk(on_url, connections=64, seconds=2, headers=on_headers)  # warm both up
        wrk(off_url, connections=64, seconds=2, headers=off_headers)
        ons: list[WrkResult] = []
        offs: list[WrkResult] = []
        scrapes: list[int] = []

        def run_on() -> None:
            with contextlib.nullcontext([]) if args.control else scraping(on) as sizes:
                ons.append(wrk(on_url, connections=64, seconds=args.seconds, headers=on_headers))
            scrapes.extend(sizes)

        def run_off() -> None:
            offs.append(wrk(off_url, connections=64, seconds=args.seconds, headers=off_headers))

        for round_ in range(args.rounds):
            for run in (run_on, run_off) if round_ % 2 == 0 else (run_off, run_on):
                run()

    on_name = "metrics off too (control)" if args.control else "metrics on, scraped 1/s"
    for name, runs in (("metrics off", offs), (on_name, ons)):
        each = ", ".join(f"{r.requests_per_second:.0f}" for r in runs)
        print(f"{name + ':':27} {each} req/s")
    ratios = [a.requests_per_second / b.requests_per_second for a, b in zip(ons, offs, strict=True)]
    print(f"{'ratio in each round:':27} {', '.join(f'{r:.3f}' for r in ratios)}")
    off_rps = median([r.requests_per_second for r in offs])
    on_rps = median([r.requests_per_second for r in ons])
    non_2xx = sum(r.non_2xx for r in [*ons, *offs])
    for name, runs, rps in (("metrics off", offs, off_rps), (on_name, ons, on_rps)):
        p99 = median([r.p99_ms for r in runs])
        print(f"median, {name + ':':33} {rps:7.0f} req/s   p99 {p99:6.1f} ms")
    print(f"ratio of the medians:              {on_rps / off_rps:7.3f}   (non-2xx: {non_2xx})")
    print(f"median of the rounds' ratios:      {median(ratios):7.3f}")
    if scrapes:
        print(f"scrapes during the runs: {len(scrapes)}, {median(scrapes):.0f} bytes each")
    return verdict(
        {
            f"metrics on >= {TARGET_RATIO}x metrics off (median of the rounds), all 2xx": median(
                ratios
            )
            >= TARGET_RATIO
            and non_2xx == 0
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
