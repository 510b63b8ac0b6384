"""The two store backends side by side, below the API, in one run on one machine.

- claims: operations queued, then claimed and finished by dispatchers (one; and on PostgreSQL
  four at once, each its own store: four processes), as the engine does it: a read of the unsettled, a claim,
  an outcome recorded. Operations claimed per second, and that none was claimed twice.
- reads: the hot read of every request (an operations page of 10), per second, one reader.
- writes: a small write transaction (a key's use recorded), per second, one writer.

PostgreSQL is a local cluster started from the platform's binaries (tests/pgstore.py), fsync
off as in the tests: the figures compare the statements and round trips, not the disks.

    .venv/bin/python -m bench.store_backends [--operations 400] [--seconds 3] [--smoke]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import msgspec
from tests.pgstore import stop_store_cluster, store_cluster
from tests.support import finished_operation, no_pg_settings

from bench.common import parse_with_smoke  # and puts the repository on sys.path
from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.operations import Status, claimable
from pgplane.services import accounts, projects
from pgplane.store import Store
from pgplane.store.postgresql import PostgresStore
from pgplane.store.sqlite import SqliteStore


async def _queue(store: Store, count: int) -> str:
    """A project (made as the API makes one) with ``count`` operations queued, one per branch
    (none waits behind another)."""
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="bench@example.com")
        created = await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(pg_versions=(16,), compute_ports=(45000, 45999)),
            check_settings=no_pg_settings,
        )
    project_id = created.project.id
    now = clock.now_us()
    async with store.write() as tx:
        await tx.insert_operations(
            [
                msgspec.structs.replace(
                    finished_operation(project_id, now), status=Status.SCHEDULING, branch_id=f"b{i}"
                )
                for i in range(count)
            ]
        )
    return project_id


async def _dispatcher(store: Store, owner: str, claimed: list[str]) -> None:
    while True:
        async with store.read() as tx:
            unsettled = await tx.list_unsettled_operations()
        ready = claimable(unsettled, clock.now_us())
        if not unsettled:
            return
        for op in ready:
            now = clock.now_us()
            async with store.write() as tx:
                got = await tx.claim_operation(
                    seen=op, owner=owner, now=now, lease_until=now + 10**7, failed_attempt=False
                )
            if got is None:
                continue
            claimed.append(got.id)
            done = msgspec.structs.replace(
                got, status=Status.FINISHED, lease_owner=None, updated_at=clock.now_us()
            )
            async with store.write() as tx:
                assert await tx.update_owned_operation(done, owner=owner)


async def claims(open_store: object, count: int, dispatchers: int) -> float:
    stores: list[Store] = [await open_store() for _ in range(dispatchers)]  # type: ignore[operator]
    try:
        await _queue(stores[0], count)
        claimed: list[str] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(_dispatcher(s, f"d{i}", claimed) for i, s in enumerate(stores)))
        elapsed = time.perf_counter() - t0
        # Every one once (the project's own creation operations are claimed too).
        assert len(claimed) == len(set(claimed)) >= count, (len(claimed), len(set(claimed)))
        return len(claimed) / elapsed
    finally:
        for s in stores:
            await s.close()


async def reads_and_writes(store: Store, seconds: float) -> tuple[float, float]:
    project_id = await _queue(store, 50)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        async with store.read() as tx:
            page = await tx.list_operations(project_id=project_id, before=None, limit=10)
        assert len(page) == 10
        n += 1
    reads = n / (time.perf_counter() - t0)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        async with store.write() as tx:
            await tx.record_endpoint_activity([("ep-none", clock.now_us())])
        n += 1
    return reads, n / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pgplane-bench-store-") as tmp:
        await _run_in(Path(tmp), args)


async def _run_in(work: Path, args: argparse.Namespace) -> None:
    counter = iter(range(1000))
    cluster = store_cluster()

    def fresh_sqlite() -> object:
        path = work / f"fresh{next(counter)}.db"

        async def opener() -> Store:
            return SqliteStore(path)

        return opener

    def fresh_pg() -> object:
        url = cluster.database()

        async def opener() -> Store:
            return await PostgresStore.open(url)

        return opener

    print(f"{'':28}{'SQLite':>12}{'PostgreSQL':>14}")
    s = await claims(fresh_sqlite(), args.operations, 1)
    p = await claims(fresh_pg(), args.operations, 1)
    print(f"claims/s, 1 dispatcher{'':6}{s:12.0f}{p:14.0f}")
    # One serve per SQLite file (its data directory's lock): several dispatchers on one SQLite
    # store is not a configuration there is (its writers, without a fair queue, starve).
    p = await claims(fresh_pg(), args.operations, 4)
    print(f"claims/s, 4 dispatchers{'':5}{'-':>12}{p:14.0f}")
    sq = await fresh_sqlite()()  # type: ignore[operator]
    pg = await fresh_pg()()  # type: ignore[operator]
    try:
        sr, sw = await reads_and_writes(sq, args.seconds)
        pr, pw = await reads_and_writes(pg, args.seconds)
    finally:
        await sq.close()
        await pg.close()
    print(f"reads/s (page of 10){'':8}{sr:12.0f}{pr:14.0f}")
    print(f"write transactions/s{'':8}{sw:12.0f}{pw:14.0f}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--operations", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=3.0)
    args = parse_with_smoke(parser, operations=20, seconds=0.5)
    try:
        asyncio.run(run(args))
    finally:
        stop_store_cluster()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
