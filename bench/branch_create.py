"""Branch creation: from ``POST /projects/{id}/branches`` until its create_branch has finished.

Three measurements on a real ``pgplane serve``:

- a parent holding ~1 GB (a table filled through its connection URI, then CHECKPOINT), its
  compute running: the branch beside a bare ``cp -a`` of the same parent data directory (warm
  cache, same run, rounds interleaved). Target: at most 1.3x the bare copy;
- the same branch while a writer commits on the parent in a loop through its URI: the longest
  gap between two of its commits while the branch is made. Target: under 1 s;
- a branch of a fresh (small) parent. Target: under 300 ms. Its files are spares made ahead
  (see ``compute/local/copies/spares.py``); the first branch since start-up, made without them, is
  reported beside it.

As root each project lives on a filesystem of its own (``compute/local/tenants/volumes.py``):
on XFS a branch's files are clones of its parent's, and the branch costs neither the copy's
time nor its space; ``PGPLANE_WALLS=off`` measures copies on the data directory's disk.

The branch writes its copy durably (one syncfs), which the bare ``cp -a`` does not; the line
``cp -a + sync`` shows what that costs. The parent's pg_wal holds about as much recycled WAL as
data after the fill: ``cp -a`` copies it, a branch only the segments it needs.

    .venv/bin/python -m bench.branch_create [--gb 1.0] [--runs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from bench.common import Api, Server, median, parse_with_smoke, running_server, verdict
from pgplane.compute.local.layout import Layout
from pgplane.compute.local.postgres.records import Records
from pgplane.compute.local.postgres.sessions import admin_conninfo

ROWS_PER_GB = 1_900_000  # rows of (int, 500 x 'x'): ~1 GB of table


@dataclass
class Parent:
    project_id: str
    branch_id: str
    endpoint_id: str
    uri: str
    pgdata: Path


def make_parent(api: Api, server: Server, name: str) -> Parent:
    body = api.create_ready_project(name=name)
    project_id = body["project"]["id"]
    branch_id = body["branch"]["id"]
    return Parent(
        project_id=project_id,
        branch_id=branch_id,
        endpoint_id=body["endpoints"][0]["id"],
        uri=body["connection_uris"][0]["connection_uri"],
        pgdata=Layout(server.data_dir.resolve()).pgdata(project_id, branch_id),
    )


def fill(server: Server, parent: Parent, gb: float) -> float:
    """~``gb`` GB in one table, then a checkpoint (as cloud_admin: the role may not)."""
    t0 = time.perf_counter()
    with psycopg.connect(parent.uri, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t AS SELECT g, repeat('x', 500) AS pad FROM generate_series(1, %s) g",
            [int(gb * ROWS_PER_GB)],
        )
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    # The URI names the proxy; the compute's own socket and port are the platform's records.
    running = Records(server.data_dir.resolve() / "postmasters").get(parent.pgdata)
    assert running is not None, "the parent is not running"
    conninfo = admin_conninfo(running.socket_dir, running.port)
    with psycopg.connect(conninfo, autocommit=True) as admin:
        admin.execute("CHECKPOINT")
    print(
        f"filled the parent with {size[0] / 1e9 if size else 0:.2f} GB in {time.perf_counter() - t0:.0f} s"
    )
    return float(size[0]) if size else 0.0


def create_branch(api: Api, parent: Parent) -> tuple[float, str]:
    """POST a branch without endpoints; seconds until its create_branch finished, its id."""
    t0 = time.perf_counter()
    r = api.http.post(
        f"/projects/{parent.project_id}/branches",
        json={"branch": {"parent_id": parent.branch_id}, "endpoints": []},
    )
    assert r.status_code == 201, r.text
    body = r.json()
    op_id = next(o["id"] for o in body["operations"] if o["action"] == "create_branch")
    while True:
        op = api.http.get(f"/projects/{parent.project_id}/operations/{op_id}").json()["operation"]
        if op["status"] == "finished":
            return time.perf_counter() - t0, body["branch"]["id"]
        assert op["status"] not in ("failed", "error", "cancelled"), op
        time.sleep(0.005)


def delete_branch(api: Api, parent: Parent, branch_id: str) -> None:
    """Free the copy's disk space for the next round (best effort)."""
    r = api.http.delete(f"/projects/{parent.project_id}/branches/{branch_id}")
    if r.status_code == 200:
        api.wait_operations(parent.project_id, [o["id"] for o in r.json().get("operations", [])])


def bare_copy(pgdata: Path, scratch: Path, *, sync: bool = False, wal: bool = True) -> float:
    target = scratch / "copy"
    shutil.rmtree(target, ignore_errors=True)
    os.sync()
    t0 = time.perf_counter()
    if wal:
        subprocess.run(["cp", "-a", "--", str(pgdata), str(target)], check=True)
    else:  # about the bytes a branch copies (it adds the few WAL segments it needs)
        target.mkdir(mode=0o700)
        sources = [str(p) for p in pgdata.iterdir() if p.name != "pg_wal"]
        subprocess.run(["cp", "-a", "--", *sources, str(target)], check=True)
    if sync:
        os.sync()
    elapsed = time.perf_counter() - t0
    shutil.rmtree(target)
    return elapsed


def du(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e9


@dataclass
class Writer:
    """Commits on the parent in a loop through its URI, recording when each commit returned."""

    uri: str
    commits: list[float] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Writer:
        with psycopg.connect(self.uri, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS w (id bigserial, at timestamptz, pad text)")
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        while not self.commits and not self.errors:
            time.sleep(0.01)
        return self

    def _run(self) -> None:
        try:
            with psycopg.connect(self.uri, autocommit=True) as conn:
                while not self._stop.is_set():
                    conn.execute("INSERT INTO w (at, pad) VALUES (now(), repeat('w', 200))")
                    self.commits.append(time.perf_counter())
        except BaseException as exc:  # reported, not raised in a thread
            self.errors.append(exc)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def max_gap(self, start: float, end: float) -> float:
        """The longest wait for a commit in [start, end], edges included."""
        times = [start, *(t for t in self.commits if start < t < end), end]
        after = [t for t in self.commits if t >= end]
        if after:
            times[-1] = after[0]
        return max(b - a for a, b in itertools.pairwise(times))


def line(what: str, values: list[float], note: str = "", stat: str = "median") -> None:
    value = max(values) if stat == "max" else median(values)
    runs = sorted(round(v) for v in values)
    print(f"{what + ':':34s} {stat:6s} {value:7.0f} ms   {runs}" + (f"   ({note})" if note else ""))


def measure_small(api: Api, server: Server, scratch: Path, runs: int) -> dict[str, list[float]]:
    """A fresh parent: the copy of a new cluster (~1,300 small files).

    The first branch since start-up finds no spare files (``compute/local/copies/spares.py``) and
    creates every inode; the platform then makes spares in the background. Each later round
    waits until they are made, as branches a few seconds apart find them.
    """
    small = make_parent(api, server, "small")
    spares = server.data_dir / "spare"
    first, branch_id = create_branch(api, small)
    out: dict[str, list[float]] = {"branch": [], "cp": [], "first": [first * 1000]}
    delete_branch(api, small, branch_id)
    for _ in range(runs):
        out["cp"].append(bare_copy(small.pgdata, scratch) * 1000)
        wait_for_spares(spares)
        elapsed, branch_id = create_branch(api, small)
        out["branch"].append(elapsed * 1000)
        delete_branch(api, small, branch_id)
    return out


def wait_for_spares(directory: Path, timeout: float = 30) -> None:
    """Until the number of spares in ``directory`` has not changed for 0.5 s."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(os.listdir(directory)) if directory.is_dir() else 0
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= 0.5:
            return
        time.sleep(0.05)


def measure_big(api: Api, big: Parent, scratch: Path, runs: int) -> dict[str, list[float]]:
    """Branches of the filled parent, interleaved with bare copies of its data directory."""
    bare_copy(big.pgdata, scratch)  # warm the cache
    out: dict[str, list[float]] = {"branch": [], "cp": [], "cp_sync": [], "cp_data": []}
    for _ in range(runs):
        out["cp"].append(bare_copy(big.pgdata, scratch) * 1000)
        out["cp_sync"].append(bare_copy(big.pgdata, scratch, sync=True) * 1000)
        out["cp_data"].append(bare_copy(big.pgdata, scratch, wal=False) * 1000)
        elapsed, branch_id = create_branch(api, big)
        out["branch"].append(elapsed * 1000)
        delete_branch(api, big, branch_id)
    return out


def measure_busy(api: Api, big: Parent, runs: int) -> dict[str, list[float]]:
    """Branches of the filled parent while a writer commits on it; the writer's longest gaps."""
    out: dict[str, list[float]] = {"branch": [], "gap": [], "idle_gap": []}
    with Writer(big.uri) as writer:
        t0 = time.perf_counter()
        time.sleep(2)
        out["idle_gap"].append(writer.max_gap(t0, time.perf_counter()) * 1000)
        for _ in range(runs):
            start = time.perf_counter()
            elapsed, branch_id = create_branch(api, big)
            time.sleep(0.5)
            out["branch"].append(elapsed * 1000)
            out["gap"].append(writer.max_gap(start, start + elapsed) * 1000)
            delete_branch(api, big, branch_id)
    assert not writer.errors, writer.errors
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=3)
    args = parse_with_smoke(parser, gb=0.01, runs=1)

    with running_server() as server:
        _, key = server.create_key("branch@example.com")
        scratch = server.data_dir / "bench-scratch"
        scratch.mkdir()
        with Api(server, key) as api:
            small = measure_small(api, server, scratch, args.runs + 2)
            big_parent = make_parent(api, server, "big")
            fill(server, big_parent, args.gb)
            data_gb, wal_gb = du(big_parent.pgdata), du(big_parent.pgdata / "pg_wal")
            big = measure_big(api, big_parent, scratch, args.runs)
            busy = measure_busy(api, big_parent, args.runs)

    ratio = median(big["branch"]) / median(big["cp"])
    data_ratio = median(big["branch"]) / median(big["cp_data"])
    small_ratio = median(small["branch"]) / median(small["cp"])
    print(f"parent: {data_gb:.2f} GB on disk, of which pg_wal {wal_gb:.2f} GB")
    line("bare cp -a of the parent", big["cp"])
    line("bare cp -a + sync", big["cp_sync"])
    line("bare cp -a without pg_wal", big["cp_data"])
    line("branch of the parent", big["branch"], f"{ratio:.2f}x cp -a, {data_ratio:.2f}x w/o pg_wal")
    line("branch under a steady writer", busy["branch"])
    idle = f"without a branch: {busy['idle_gap'][0]:.0f} ms"
    line("writer's longest pause", busy["gap"], idle, "max")
    line("bare cp -a of a fresh cluster", small["cp"])
    line("branch of a fresh parent", small["branch"], f"{small_ratio:.2f}x cp -a")
    line("  the first, no spares yet", small["first"])
    checks = {
        "branch <= 1.3x cp -a": ratio <= 1.3,
        "writer pause < 1 s": max(busy["gap"]) < 1000,
        "fresh parent < 300 ms": median(small["branch"]) < 300,
    }
    return verdict(checks, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
