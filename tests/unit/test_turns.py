"""Turns per key, and the point reads that take them: one of a project's at once, so many in
all, the rest waiting their turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from pgplane.compute.local.history import point_reads
from pgplane.compute.local.history.point_reads import PointReads
from pgplane.core.turns import Turns
from pgplane.services import schemas


async def test_a_key_holds_at_most_its_turns_and_is_forgotten_when_done() -> None:
    turns = Turns(2)
    running = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    release = asyncio.Event()

    async def hold(key: str) -> None:
        async with turns.turn(key):
            running[key] += 1
            most[key] = max(most[key], running[key])
            await release.wait()
            running[key] -= 1

    tasks = [asyncio.create_task(hold("a")) for _ in range(5)] + [asyncio.create_task(hold("b"))]
    await asyncio.sleep(0.01)
    assert running == {"a": 2, "b": 1}  # b is not behind a's
    release.set()
    await asyncio.gather(*tasks)
    assert most == {"a": 2, "b": 1} and len(turns) == 0


async def test_point_reads_rebuild_one_of_a_project_at_once_and_so_many_in_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each a base copied and WAL replayed, outside the engine's slots: an account asking for
    forty at once had forty rebuilds, every thread of the platform's."""
    monkeypatch.setattr(point_reads, "AT_ONCE", 3)
    reads = PointReads(SimpleNamespace(layout=Path("/nowhere")), *([None] * 4))  # type: ignore[arg-type]
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    in_all = [0, 0]  # now, most
    release = asyncio.Event()

    async def rebuild(project_id: str, *_: Any) -> None:
        running[project_id] = running.get(project_id, 0) + 1
        most[project_id] = max(most.get(project_id, 0), running[project_id])
        in_all[0] += 1
        in_all[1] = max(in_all)
        await release.wait()
        running[project_id] -= 1
        in_all[0] -= 1

    monkeypatch.setattr(reads, "_run", rebuild)
    asks = [
        asyncio.create_task(reads.run(project, "br", 17, None, None))  # type: ignore[arg-type]
        for project in ["p1"] * 4 + ["p2", "p3", "p4", "p5"]
    ]
    await asyncio.sleep(0.01)
    assert in_all[0] == 3 and running["p1"] == 1
    release.set()
    await asyncio.gather(*asks)
    assert most == dict.fromkeys(["p1", "p2", "p3", "p4", "p5"], 1) and in_all[1] == 3


async def test_an_account_reads_so_many_schemas_at_once_whatever_its_projects() -> None:
    """Each read holds a thread of the tenants' pool (``pg_dump``, up to its lock timeout) or one
    of the node's point rebuilds: an account's reads on many projects take only its share, and
    another account's read is not behind them."""
    release = asyncio.Event()
    inside: list[str] = []

    async def dumper(*, project_id: str, **_: object) -> str:
        inside.append(project_id)
        await release.wait()
        return f"-- {project_id}"

    def found(account: str, project: str) -> schemas.Target:
        shape: Any = SimpleNamespace(id=project, account_id=account, pg_version=16)
        return schemas.Target(shape, SimpleNamespace(id=f"br-{project}"), "neondb")  # type: ignore[arg-type]

    reads = [found("a", f"a{n}") for n in range(6)] + [found("b", "b0")]
    tasks = [asyncio.create_task(schemas.read(dumper, target, max_bytes=1)) for target in reads]
    await asyncio.sleep(0.01)
    assert sorted(inside) == ["a0", "a1", "b0"]  # a's other four wait; b's is not behind them
    release.set()
    assert await asyncio.gather(*tasks) == [f"-- {target.project.id}" for target in reads]
