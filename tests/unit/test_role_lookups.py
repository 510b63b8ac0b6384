"""The proxy's role lookups share one session per compute: kept while they come, opened again
when it broke (the compute restarted), closed once idle or when the compute stops."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgplane.compute.driver import ComputeError
from pgplane.compute.local.postgres import role_lookups
from pgplane.compute.local.postgres.role_lookups import RoleLookups

SOCKET = Path("/run/pgplane/ep-x")


class _Conn:
    def __init__(self) -> None:
        self.closed = False
        self.broken = False

    async def close(self) -> None:
        self.closed = True


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[_Conn]:
    conns: list[_Conn] = []

    async def connect(_info: str) -> Any:
        conns.append(_Conn())
        return conns[-1]

    async def query(conn: Any, names: Sequence[str] | None) -> Mapping[str, str]:
        if conn.broken:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return {name: "SCRAM-SHA-256$…" for name in names or () if name == "made_with_sql"}

    monkeypatch.setattr(role_lookups, "connect", connect)
    monkeypatch.setattr(role_lookups, "query_verifiers", query)
    return conns


async def test_lookups_share_one_session_and_open_another_once_it_broke(
    opened: list[_Conn], monkeypatch: pytest.MonkeyPatch
) -> None:
    lookups = RoleLookups(idle_seconds=60)
    answers = await asyncio.gather(
        *(lookups.read(SOCKET, 5432, [f"made_up_{i}"]) for i in range(20)),
        lookups.read(SOCKET, 5432, ["made_with_sql"]),
    )
    assert answers[:-1] == [{}] * 20
    assert answers[-1] == {"made_with_sql": "SCRAM-SHA-256$…"}
    assert len(opened) == 1

    opened[0].broken = True  # the compute restarted: the kept session is gone
    assert await lookups.read(SOCKET, 5432, ["made_with_sql"]) == {
        "made_with_sql": "SCRAM-SHA-256$…"
    }
    assert len(opened) == 2 and opened[0].closed and not opened[1].closed

    opened[1].broken = True
    opened_next = len(opened)

    async def connect_refused(_info: str) -> Any:
        raise psycopg.OperationalError("no such file or directory")

    monkeypatch.setattr(role_lookups, "connect", connect_refused)
    with pytest.raises(ComputeError, match="reading the compute's roles"):
        await lookups.read(SOCKET, 5432, ["made_with_sql"])
    assert len(opened) == opened_next and opened[1].closed
    await lookups.close()


async def test_a_session_is_closed_once_idle_and_when_its_compute_stops(
    opened: list[_Conn],
) -> None:
    lookups = RoleLookups(idle_seconds=0.05)
    await lookups.read(SOCKET, 5432, ["made_up"])
    await asyncio.sleep(0.2)
    assert opened[0].closed
    await lookups.read(SOCKET, 5432, ["made_up"])
    assert len(opened) == 2 and not opened[1].closed
    await lookups.forget(SOCKET)
    assert opened[1].closed
    await lookups.close()
