"""Expiry below the API: the rules of services/expiry.py, and one deletion however many
scheduler ticks race for a due branch (the end-to-end tests are tests/e2e/test_expiry.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.models import Branch, Operation
from pgplane.errors import BadRequest
from pgplane.services import accounts, expiry, projects, scheduled
from pgplane.store.sqlite import SqliteStore
from tests.support import no_pg_settings

_US = 1_000_000
NOW = 1_800_000_000 * _US


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    s = SqliteStore(tmp_path / "store.db")
    yield s
    await s.close()


def _branch(**fields: object) -> Branch:
    base = Branch(
        id="br-a-b-c",
        project_id="p",
        parent_id="br-d-e-f",
        name="x",
        default=False,
        protected=False,
        current_state="ready",
        pending_state=None,
        state_changed_at=0,
        created_at=0,
        updated_at=0,
    )
    return msgspec.structs.replace(base, **fields)


def test_a_time_is_kept_to_the_second() -> None:
    assert expiry.parse("2027-01-15T08:00:00.999999+01:00") == clock.parse_us(
        "2027-01-15T07:00:00Z"
    )


def test_the_window_and_the_interval() -> None:
    b = expiry.expiring(_branch(), NOW + 3600 * _US, has_children=False, now=NOW)
    assert (b.expires_at, b.ttl_interval_seconds) == (NOW + 3600 * _US, 3600)
    assert expiry.expiring(b, None, has_children=False, now=NOW).ttl_interval_seconds is None
    last = NOW + expiry.MAX_SECONDS * _US
    assert expiry.expiring(_branch(), last, has_children=False, now=NOW).expires_at == last
    for bad in (NOW, NOW - _US, last + _US):
        with pytest.raises(BadRequest, match="expires_at must be"):
            expiry.expiring(_branch(), bad, has_children=False, now=NOW)


@pytest.mark.parametrize(
    ("fields", "children", "why"),
    [
        ({"default": True}, False, "default branch cannot expire"),
        ({"protected": True}, False, "protected branch cannot expire"),
        ({}, True, "child branches cannot expire"),
    ],
)
def test_what_never_expires(fields: dict[str, object], children: bool, why: str) -> None:
    with pytest.raises(BadRequest, match=f"^expires_at: .*{why}"):
        expiry.expiring(_branch(**fields), NOW + _US, has_children=children, now=NOW)


def test_a_restore_counts_the_interval_again() -> None:
    b = expiry.expiring(_branch(), NOW + 600 * _US, has_children=False, now=NOW)
    later = NOW + 100 * _US + 250_000
    assert expiry.restarted(b, later).expires_at == NOW + 700 * _US
    assert expiry.restarted(_branch(), later).expires_at is None


async def test_racing_ticks_delete_a_due_branch_once(store: SqliteStore) -> None:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="expiry@example.com")
        made = await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=Settings(pg_versions=(16,), compute_ports=(45000, 45999)),
            check_settings=no_pg_settings,
        )
        main = made.branch
        due = msgspec.structs.replace(
            main, id="br-due-branch-00000000", name="due", default=False, parent_id=main.id
        )
        await tx.insert_branch(msgspec.structs.replace(due, expires_at=clock.now_us() - _US))
    now = clock.now_us()
    async with store.read() as tx:
        assert [b.id for b in await tx.expired_branches(now=now)] == [due.id]

    async def tick() -> list[Operation] | None:
        async with store.write() as tx:
            return await scheduled.expire(tx, project_id=due.project_id, branch_id=due.id, now=now)

    results = await asyncio.gather(*(tick() for _ in range(5)))
    started = [r for r in results if r is not None]
    assert len(started) == 1 and [o.action for o in started[0]] == ["delete_timeline"]
    async with store.read() as tx:
        assert await tx.expired_branches(now=now) == []
        ops = await tx.list_unsettled_operations(project_id=due.project_id)
    assert sum(o.action == "delete_timeline" and o.branch_id == due.id for o in ops) == 1
