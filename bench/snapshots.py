"""Snapshots beside branches: what keeping a branch's data as a snapshot, and restoring it into a
new branch, cost next to branching the same data, on a real ``pgplane serve``.

A parent holding ``--mb`` of table (its compute running), then interleaved rounds
of: a branch at its head (``create_branch``), a snapshot at its head (``create_snapshot``), and
a new branch restored from that snapshot (``create_branch`` of the snapshot). Each is timed
from the request until its operation finished (wall clock as the client sees it). The snapshot
is an online copy as the branch is, plus its seal and count; the restore a file copy of stopped
data.

Targets: a snapshot at most 1.3x a branch at the head; a restore at most 1.3x a branch.

    .venv/bin/python -m bench.snapshots [--mb 256] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import time

import psycopg

from bench.common import Api, median, parse_with_smoke, running_server, verdict

_ROWS_PER_MB = 1_900  # rows of (int, 500 x 'x')


def _timed(api: Api, pid: str, method: str, path: str, **kwargs: object) -> tuple[float, dict]:
    started = time.perf_counter()
    r = api.http.request(method, path, **kwargs)  # type: ignore[arg-type]
    body = api.settled(pid, r)
    return time.perf_counter() - started, body


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    args = parse_with_smoke(parser, mb=1, runs=1)
    with running_server() as server:
        _, key = server.create_key("bench-snapshots@example.com")
        with Api(server, key) as api:
            project = api.create_ready_project(name="snapshots")
            pid, main_id = project["project"]["id"], project["branch"]["id"]
            uri = project["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, autocommit=True) as conn:
                conn.execute("CREATE TABLE t (v int, pad text)")
                conn.execute(
                    "INSERT INTO t SELECT g, repeat('x', 500) FROM generate_series(1, %s) g",
                    (args.mb * _ROWS_PER_MB,),
                )
            branch_s, snapshot_s, restore_s = [], [], []
            for run in range(args.runs):
                took, _ = _timed(
                    api, pid, "POST", f"/projects/{pid}/branches",
                    json={"branch": {"name": f"b{run}", "parent_id": main_id}},
                )  # fmt: skip
                branch_s.append(took)
                took, body = _timed(
                    api, pid, "POST", f"/projects/{pid}/branches/{main_id}/snapshot"
                )
                snapshot_s.append(took)
                took, _ = _timed(
                    api, pid, "POST", f"/projects/{pid}/snapshots/{body['snapshot']['id']}/restore",
                    json={"name": f"r{run}"},
                )  # fmt: skip
                restore_s.append(took)
            snapshots = api.http.get(f"/projects/{pid}/snapshots").json()["snapshots"]
    b, s, r = median(branch_s), median(snapshot_s), median(restore_s)
    size = median([float(x["full_size"]) for x in snapshots]) / 1e6
    print(f"parent: {args.mb} MB of table; each snapshot takes {size:.0f} MB on disk")
    print(f"branch at the head:      median {b * 1000:.0f} ms over {args.runs}")
    print(f"snapshot at the head:    median {s * 1000:.0f} ms ({s / b:.2f}x the branch)")
    print(f"restore to a new branch: median {r * 1000:.0f} ms ({r / b:.2f}x the branch)")
    return verdict(
        {"snapshot <= 1.3x branch": s <= 1.3 * b, "restore <= 1.3x branch": r <= 1.3 * b},
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
