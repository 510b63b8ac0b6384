"""Nodes in the store, on both backends: registration and the name's lease, placement of new
projects (least loaded, cordons, down nodes), adoption of an earlier store's projects, claims
only by the project's node, and the retryable refusal of work for a project whose node is down."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pgplane.config import Settings
from pgplane.core import clock
from pgplane.core.nodes import ACTIVE, CORDONED, Node, NodeLoad, check_name, choose, default_name
from pgplane.core.operations import Action
from pgplane.errors import NotFound, Unavailable
from pgplane.services import accounts, nodes, operations, projects
from pgplane.services.projects import CreatedProject
from pgplane.store import Store
from pgplane.store.sqlite import SqliteStore
from tests.support import no_pg_settings

_US = 1_000_000
_SETTINGS = Settings(pg_versions=(16,), compute_ports=(45000, 45999))


@pytest.fixture
def store(any_store: Store) -> Store:
    return any_store


def _node(
    name: str, *, instance: str | None = None, now: int | None = None, lease_s: int = 20
) -> Node:
    """A node of a data directory of its own (``instance``: ``home.process``)."""
    now = clock.now_us() if now is None else now
    instance = f"{name}.i" if instance is None else instance
    return Node(
        name=name,
        instance=instance,
        api_url=f"http://{name}:8080",
        proxy_address=f"{name}:5432",
        compute_host="127.0.0.1",
        capacity=10,
        state=ACTIVE,
        started_at=now,
        heartbeat_at=now,
        expires_at=now + lease_s * _US,
    )


async def _register(store: Store, node: Node) -> int:
    async with store.write() as tx:
        return await nodes.register(tx, node)


async def _project(store: Store) -> CreatedProject:
    async with store.write() as tx:
        account = await accounts.ensure(tx, email="nodes@example.com")
        return await projects.create(
            tx,
            account_id=account.id,
            spec=projects.NewProject(),
            settings=_SETTINGS,
            check_settings=no_pg_settings,
        )


async def _placed(store: Store, project_id: str) -> str | None:
    async with store.read() as tx:
        node = await tx.project_node(project_id)
    return None if node is None else node.name


async def test_new_projects_spread_over_the_active_nodes(store: Store) -> None:
    await _register(store, _node("a"))
    await _register(store, _node("b"))
    placed = [await _placed(store, (await _project(store)).project.id) for _ in range(4)]
    assert sorted(placed) == ["a", "a", "b", "b"]  # type: ignore[type-var]
    async with store.read() as tx:
        loads = {load.node.name: load.projects for load in await tx.node_loads()}
    assert loads == {"a": 2, "b": 2}


async def test_a_cordoned_or_down_node_gets_no_new_project(store: Store) -> None:
    now = clock.now_us()
    await _register(store, _node("a"))
    await _register(store, _node("b"))
    await _register(store, _node("gone", now=now - 60 * _US))  # its lease ran out long ago
    async with store.write() as tx:
        assert (await nodes.set_state(tx, name="a", state=CORDONED)).state == CORDONED
    for _ in range(3):
        assert await _placed(store, (await _project(store)).project.id) == "b"
    async with store.write() as tx:
        await nodes.set_state(tx, name="b", state=CORDONED)
    with pytest.raises(Unavailable) as refused:
        await _project(store)
    assert refused.value.headers.get("Retry-After")
    assert "a: cordoned" in refused.value.message
    assert "gone: down" in refused.value.message
    async with store.write() as tx:
        with pytest.raises(NotFound):
            await nodes.set_state(tx, name="nobody", state=CORDONED)
        await nodes.set_state(tx, name="a", state=ACTIVE)
    assert await _placed(store, (await _project(store)).project.id) == "a"


async def test_a_restart_keeps_the_cordon_and_a_live_name_is_not_taken_twice(store: Store) -> None:
    await _register(store, _node("a", instance="here.first"))
    # The same data directory restarted (the first process gone): the name is taken back.
    await _register(store, _node("a", instance="here.again"))
    async with store.write() as tx:
        await nodes.set_state(tx, name="a", state=CORDONED)
    with pytest.raises(nodes.NameTaken):
        await _register(store, _node("a", instance="elsewhere.second"))
    # Once the first's lease has lapsed (it died), a new process takes the name back.
    later = clock.now_us() + 30 * _US
    await _register(store, _node("a", instance="elsewhere.second", now=later))
    async with store.write() as tx:
        node = await tx.get_node("a")
        assert node is not None
        assert (node.instance, node.state) == ("elsewhere.second", CORDONED)
        # The old process's heartbeat no longer renews anything.
        assert not await tx.renew_node(name="a", instance="here.again", now=later, expires_at=later)
        assert await tx.renew_node(
            name="a", instance="elsewhere.second", now=later, expires_at=later + 1
        )


async def test_the_first_node_adopts_the_projects_of_a_store_without_nodes(store: Store) -> None:
    created = await _project(store)  # no node registered: not placed
    assert await _placed(store, created.project.id) is None
    assert await _register(store, _node("a")) == 1
    assert await _placed(store, created.project.id) == "a"
    assert await _register(store, _node("b")) == 0


async def test_a_data_directory_renamed_keeps_its_projects(store: Store) -> None:
    await _register(store, _node("old-host-1234", instance="home.first"))
    await _register(store, _node("other", instance="elsewhere.x"))
    pid = (await _project(store)).project.id
    assert await _placed(store, pid) == "old-host-1234"
    # The same directory, started again under a new host name.
    assert await _register(store, _node("new-host-1234", instance="home.second")) == 1
    assert await _placed(store, pid) == "new-host-1234"
    async with store.read() as tx:
        assert [load.node.name for load in await tx.node_loads()] == ["new-host-1234", "other"]


async def test_operations_are_claimed_only_by_their_projects_node(store: Store) -> None:
    await _register(store, _node("a"))
    await _register(store, _node("b"))
    on_a = await _project(store)
    assert await _placed(store, on_a.project.id) == "a"
    seen = on_a.operations[0]
    now = clock.now_us()
    async with store.read() as tx:
        assert not await tx.list_unsettled_operations(node="b")
        assert [o.id for o in await tx.list_unsettled_operations(node="a")] == [
            o.id for o in on_a.operations
        ]
    claim = {"seen": seen, "now": now, "lease_until": now + _US, "failed_attempt": False}
    async with store.write() as tx:
        assert await tx.claim_operation(owner="b:1", node="b", **claim) is None  # type: ignore[arg-type]
        claimed = await tx.claim_operation(owner="a:1", node="a", **claim)  # type: ignore[arg-type]
    assert claimed is not None
    assert claimed.lease_owner == "a:1"


async def test_work_for_a_project_whose_node_is_down_is_refused_and_retryable(
    store: Store,
) -> None:
    await _register(store, _node("a", lease_s=1))
    created = await _project(store)
    pid = created.project.id
    later = clock.now_us() + 5 * _US  # the lease of one second has lapsed by then
    async with store.write() as tx:
        with pytest.raises(Unavailable) as refused:
            await nodes.require_up(tx, pid, now=later)
    assert refused.value.status == 503
    assert refused.value.headers["Retry-After"]
    assert "node a is down" in refused.value.message
    # Now, with the lease still running, work is queued as usual.
    async with store.write() as tx:
        ops = await operations.start(
            tx, project_id=pid, starts=[operations.Start(Action.CHECK_AVAILABILITY)]
        )
    assert ops


def test_choose_weighs_projects_for_capacity_then_computes_then_name() -> None:
    now = clock.now_us()

    def load(name: str, projects: int, computes: int, capacity: int = 10) -> NodeLoad:
        node = _node(name, now=now)
        node = Node(
            **{**{f: getattr(node, f) for f in node.__struct_fields__}, "capacity": capacity}
        )
        return NodeLoad(node=node, projects=projects, computes=computes)

    assert choose([], now) is None
    assert choose([load("a", 2, 0), load("b", 1, 9)], now).name == "b"  # type: ignore[union-attr]
    assert choose([load("a", 2, 0), load("b", 2, 1)], now).name == "a"  # type: ignore[union-attr]
    assert choose([load("a", 2, 0, 10), load("b", 3, 0, 30)], now).name == "b"  # type: ignore[union-attr]
    assert choose([load("b", 0, 0), load("a", 0, 0)], now).name == "a"  # type: ignore[union-attr]


def test_a_default_name_is_stable_per_data_directory_and_names_are_checked(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    assert default_name(one) == default_name(one)
    assert default_name(one) != default_name(two)
    assert check_name(default_name(one)) == default_name(one)
    for bad in ("", "-a", "a b", "a\nb", "x" * 64, "ä"):
        with pytest.raises(ValueError, match="node name"):
            check_name(bad)


def test_nodes_list_prints_a_table_and_a_cordon_of_no_node_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from pgplane.cli.main import app

    monkeypatch.delenv("PGPLANE_STORE", raising=False)

    async def register() -> None:
        store = SqliteStore(tmp_path / "pgplane.db")
        try:
            await _register(store, _node("node-a"))
        finally:
            await store.close()

    asyncio.run(register())
    runner = CliRunner()
    done = runner.invoke(app, ["nodes", "list", "--data-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    header, row = done.output.splitlines()
    assert header.split()[:6] == [
        "name", "state", "heartbeat_age_s", "projects", "computes", "capacity"
    ]  # fmt: skip
    assert row.split()[:2] == ["node-a", "active"]
    done = runner.invoke(app, ["nodes", "cordon", "nobody", "--data-dir", str(tmp_path)])
    assert done.exit_code == 2
    assert "no node named 'nobody'" in done.output
    done = runner.invoke(app, ["nodes", "cordon", "node-a", "--data-dir", str(tmp_path)])
    assert done.exit_code == 0, done.output
    assert '"state": "cordoned"' in done.output
