"""Moves between nodes in the store, on both backends: a drain refused where projects have
nowhere to go, a drained project's operations and its placement switched with its detach (only to
a node on the same shared storage), and a dead node's projects brought back elsewhere: refused
while its lease runs, then its unfinished work failed with the reason and started again after an
attach."""

from __future__ import annotations

import msgspec
import pytest

from pgplane.core import clock
from pgplane.core.nodes import DRAINING, Node
from pgplane.core.operations import Action, Status
from pgplane.errors import BadRequest, Conflict, Unavailable
from pgplane.services import moves
from pgplane.store import Store
from tests.unit.test_nodes import _US, _node, _placed, _project, _register


@pytest.fixture
def store(any_store: Store) -> Store:
    return any_store


def _on(name: str, shared: str | None, lease_s: int = 20) -> Node:
    return msgspec.structs.replace(_node(name, lease_s=lease_s), shared_storage=shared)


async def test_a_drain_needs_shared_storage_and_somewhere_to_go(store: Store) -> None:
    await _register(store, _on("a", None))
    await _register(store, _on("b", "s1"))
    async with store.write() as tx:
        with pytest.raises(BadRequest, match="own disk"):
            await moves.begin_drain(tx, name="a")
    await _register(store, _on("c", "s2"))
    async with store.write() as tx:
        with pytest.raises(Unavailable, match="nowhere to go"):
            await moves.begin_drain(tx, name="b")  # c is on other storage
    await _register(store, _on("d", "s1"))
    async with store.write() as tx:
        assert (await moves.begin_drain(tx, name="b")).state == DRAINING


async def test_a_drained_project_goes_with_its_detach_to_a_node_on_its_storage(
    store: Store,
) -> None:
    await _register(store, _on("a", "s1"))
    project = (await _project(store)).project
    await _register(store, _on("b", "s2"))
    await _register(store, _on("c", "s1"))
    async with store.write() as tx:
        await moves.begin_drain(tx, name="a")
        assert await moves.start_move(tx, project_id=project.id) == []  # busy: being created
    async with store.write() as tx:
        for op in await tx.list_unsettled_operations(project_id=project.id):
            await tx.abandon_operation(operation_id=op.id, error="test", now=clock.now_us())
        ops = await moves.start_move(tx, project_id=project.id)
        assert [o.action for o in ops] == [Action.TENANT_DETACH, Action.TENANT_REATTACH]
        assert await moves.after_detach(tx, project_id=project.id) == "c"
    assert await _placed(store, project.id) == "c"
    async with store.write() as tx:  # c is not draining: its detaches leave it where it is
        assert await moves.after_detach(tx, project_id=project.id) is None


async def test_a_dead_nodes_projects_are_brought_back_once_its_lease_ran_out(
    store: Store,
) -> None:
    await _register(store, _on("a", "s1", lease_s=1))
    project = (await _project(store)).project
    await _register(store, _on("b", "s1"))
    async with store.write() as tx:
        with pytest.raises(Conflict, match="is up"):
            await moves.recover(tx, dead="a")
        with pytest.raises(BadRequest, match="cannot take"):
            await moves.recover(tx, dead="a", to="a", now=clock.now_us() + 5 * _US)
        unfinished = await tx.list_unsettled_operations(project_id=project.id)
        done = await moves.recover(tx, dead="a", now=clock.now_us() + 5 * _US)
    assert [(r.project_id, r.node, r.abandoned) for r in done] == [
        (project.id, "b", len(unfinished))
    ]
    assert await _placed(store, project.id) == "b"
    async with store.read() as tx:
        for op in unfinished:
            failed = await tx.get_operation(project_id=project.id, operation_id=op.id)
            assert failed is not None and failed.status is Status.FAILED
            assert "node a was lost" in (failed.error or "")
        again = await tx.list_unsettled_operations(project_id=project.id)
        assert (await tx.get_node("a")).state == DRAINING  # type: ignore[union-attr]
    assert again[0].action is Action.TENANT_ATTACH
    assert [o.action for o in again[1:]] == [o.action for o in unfinished]
