"""``POST /projects`` latency, and time until a new project's operations have finished.

Baselines measured in the same run on the same machine: a bare ``initdb`` of the same
PostgreSQL, and a bare ``cp -a`` of an initialised cluster. Targets: the POST answers in under
50 ms; the operations finish in under a second.

    .venv/bin/python -m bench.project_create [--projects 20] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from bench.common import median, parse_with_smoke, percentile, running_server, verdict
from pgplane.compute.local import LocalComputeDriver, LocalDriverConfig


def _as_postgres_user() -> dict[str, object]:
    """initdb refuses root: run the baseline as the compute user, as pgplane does."""
    import os

    if os.geteuid() != 0:
        return {}
    return {"user": "pgplane", "group": "pgplane", "extra_groups": []}


def bare_initdb_and_copy(runs: int = 3) -> tuple[float, float]:
    # The binaries as pgplane runs them (copied where the compute user can reach them).
    with tempfile.TemporaryDirectory(prefix="pgplane-bench-") as data_dir:
        driver = LocalComputeDriver(LocalDriverConfig(data_dir=Path(data_dir)))
        install = asyncio.run(driver.runnable_installation(max(driver.pg_versions())))
        return _initdb_and_copy(install.bin_dir, runs)


def _initdb_and_copy(bin_dir: Path, runs: int) -> tuple[float, float]:
    initdb_ms, copy_ms = [], []
    for _ in range(runs):
        work = Path(tempfile.mkdtemp(prefix="pgplane-bench-"))
        work.chmod(0o777)
        t0 = time.perf_counter()
        subprocess.run(
            [str(bin_dir / "initdb"), "-D", str(work / "a"), "-U", "cloud_admin",
             "--no-locale", "-E", "UTF8", "--auth=trust"],
            check=True, capture_output=True, **_as_postgres_user(),  # type: ignore[call-overload]
        )  # fmt: skip
        initdb_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", "--reflink=auto", str(work / "a"), str(work / "b")], check=True)
        copy_ms.append((time.perf_counter() - t0) * 1000)
        shutil.rmtree(work)
    return median(initdb_ms), median(copy_ms)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--projects", type=int, default=20)
    args = parse_with_smoke(parser, projects=2)

    post_ms, settle_ms = [], []
    with running_server() as server:
        _, key = server.create_key("create@example.com")
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=server.base_url, headers=headers, timeout=30) as client:
            client.post("/projects", json={"project": {"name": "warm-up"}})  # builds the template
            time.sleep(0 if args.smoke else 2)  # the template built, the machine quiet again
            for i in range(args.projects):
                t0 = time.perf_counter()
                r = client.post("/projects", json={"project": {"name": f"p{i}"}})
                post_ms.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 201, r.text
                body = r.json()
                pid = body["project"]["id"]
                pending = [o["id"] for o in body["operations"]]
                while pending:
                    op = client.get(f"/projects/{pid}/operations/{pending[0]}").json()["operation"]
                    if op["status"] == "finished":
                        pending.pop(0)
                    else:
                        assert op["status"] != "failed", op
                        time.sleep(0.005)
                settle_ms.append((time.perf_counter() - t0) * 1000)
            for p in client.get("/projects", params={"limit": 400}).json()["projects"]:
                client.delete(f"/projects/{p['id']}")
            time.sleep(0 if args.smoke else 3)

    initdb_ms, copy_ms = bare_initdb_and_copy()
    print(f"bare initdb:                  {initdb_ms:7.1f} ms")
    print(f"bare cp -a of a new cluster:  {copy_ms:7.1f} ms")
    print(
        f"POST /projects:               median {median(post_ms):6.1f} ms   p99 {percentile(post_ms, 0.99):6.1f} ms"
    )
    print(
        f"operations finished after:    median {median(settle_ms):6.1f} ms   "
        f"max {max(settle_ms):6.1f} ms   ({median(settle_ms) / initdb_ms:.2f}x a bare initdb)"
    )
    return verdict(
        {
            "POST p99 < 50 ms": percentile(post_ms, 0.99) < 50,
            "operations finished < 1 s": max(settle_ms) < 1000,
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
