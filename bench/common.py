"""Shared by the benchmarks: a real ``pgplane serve`` on a fresh data directory, and wrk."""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass

ROOT = __file__.rsplit("/bench/", 1)[0]
sys.path.insert(0, ROOT)

from tests.support import (  # noqa: E402
    Api,
    Server,
    client_has_tls,
    free_port,
    pg_binary,
    plaintext,
    running_server,
)

__all__ = [
    "Api",
    "Server",
    "WrkResult",
    "client_has_tls",
    "free_port",
    "median",
    "parse_with_smoke",
    "percentile",
    "pg_binary",
    "plaintext",
    "running_server",
    "verdict",
    "wrk",
]


def verdict(checks: dict[str, bool], *, smoke: bool = False) -> int:
    """Print each target as met or not; the exit status: 1 when any was missed.

    The README's figures are checked by running the benchmark that prints them: a missed target
    fails the command, not only its line. A smoke run's sizes are too small for its targets to
    mean anything: they are printed, and not checked.
    """
    for name, ok in checks.items():
        print(f"target {name}: {'met' if ok else 'NOT met'}{' (smoke run: not checked)' * smoke}")
    return 0 if smoke or all(checks.values()) else 1


def parse_with_smoke(parser: argparse.ArgumentParser, **small: object) -> argparse.Namespace:
    """The bench's arguments, with ``--smoke``: the same measurements at the ``small`` sizes,
    checking no target (CI runs it: tests/e2e/test_bench_smokes*.py, so no bench can rot)."""
    sizes = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in small.items())
    parser.add_argument("--smoke", action="store_true", help=f"{sizes}; no target checked")
    args = parser.parse_args()
    if args.smoke:
        for name, value in small.items():
            setattr(args, name, value)
    return args


@dataclass(frozen=True)
class WrkResult:
    requests_per_second: float
    p50_ms: float
    p99_ms: float
    non_2xx: int


def _ms(text: str) -> float:
    value, unit = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text).groups()  # type: ignore[union-attr]
    return float(value) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]


def wrk(
    url: str, *, connections: int, seconds: int, headers: dict[str, str] | None = None
) -> WrkResult:
    """Run wrk (Debian package ``wrk``) against ``url``; parse throughput and latency."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is needed: apt-get install wrk")
    cmd = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    out = subprocess.run([*cmd, url], capture_output=True, text=True, check=True).stdout
    if "Requests/sec" not in out:
        raise RuntimeError(f"wrk printed no result:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return WrkResult(rps, p50, p99, int(bad.group(1)) if bad else 0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def median(values: list[float]) -> float:
    return statistics.median(values)
