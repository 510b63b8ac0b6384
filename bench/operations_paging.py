"""A page of operations deep in a project with 1,000,000 operations vs its first page.

Seeds the project's operations straight into the store file (a million API calls would take
hours), then times ``GET /projects/{id}/operations?limit=10`` through the running server: the
first page, and pages whose cursor lies 900,000 operations deep. Target: deep <= 1.5x first.

    .venv/bin/python -m bench.operations_paging [--operations 1000000] [--requests 300] [--smoke]

``--smoke`` seeds a thousand and times thirty requests, checking no target: CI runs it.
"""

from __future__ import annotations

import argparse
import sqlite3
import time
import uuid

import httpx

from bench.common import median, percentile, running_server, verdict
from pgplane.core import clock


def seed(db: str, project_id: str, count: int) -> list[int]:
    """Insert ``count`` finished operations, 1 ms apart, older than the project's own."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA busy_timeout = 10000")
    start = clock.now_us() - (count + 10) * 1000
    stamps = [start + i * 1000 for i in range(count)]
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO operations (id, project_id, branch_id, endpoint_id, action, status,"
        " failures_count, error, retry_at, created_at, updated_at, total_duration_ms)"
        " VALUES (?, ?, NULL, NULL, 'apply_storage_config', 'finished', 0, NULL, NULL, ?, ?, 3)",
        ((str(uuid.uuid4()), project_id, ts, ts) for ts in stamps),
    )
    conn.execute("COMMIT")
    conn.close()
    return stamps


def timed(client: httpx.Client, url: str, params: dict[str, object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.get(url, params=params)
        out.append((time.perf_counter() - t0) * 1000)
        assert r.status_code == 200 and len(r.json()["operations"]) == 10, r.text
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="small and short, no target checked")
    args = parser.parse_args()
    if args.smoke:
        args.operations, args.requests = 1000, 30

    with running_server() as server:
        _, key = server.create_key("paging@example.com")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as client:
            pid = client.post("/projects", json={"project": {"name": "deep"}}).json()["project"][
                "id"
            ]
            t0 = time.perf_counter()
            stamps = seed(str(server.data_dir / "pgplane.db"), pid, args.operations)
            print(f"seeded {args.operations} operations in {time.perf_counter() - t0:.1f} s")
            url = f"/projects/{pid}/operations"
            deep_cursor = clock.format_us(stamps[args.operations // 10])  # 90% of the way down
            timed(client, url, {"limit": 10}, 50)  # warm up
            first, deep = [], []
            for _ in range(3):  # interleave, so a noisy moment hurts both alike
                first += timed(client, url, {"limit": 10}, args.requests // 3)
                deep += timed(client, url, {"limit": 10, "cursor": deep_cursor}, args.requests // 3)

    ratio = median(deep) / median(first)
    print(
        f"first page:           median {median(first):6.2f} ms   p99 {percentile(first, 0.99):6.2f} ms"
    )
    print(
        f"page 900,000 deep:    median {median(deep):6.2f} ms   p99 {percentile(deep, 0.99):6.2f} ms"
    )
    print(f"ratio deep / first:   {ratio:6.2f}")
    return 0 if args.smoke else verdict({"deep / first <= 1.5": ratio <= 1.5})


if __name__ == "__main__":
    raise SystemExit(main())
