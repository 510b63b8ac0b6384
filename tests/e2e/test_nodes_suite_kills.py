"""Node C of three killed in the middle of every other kind of operation (``-m slow``; CI runs
two kinds in test_nodes_suite.py): a compute suspended, a role made, new settings restarting a
compute, a project created on C, a branch and a project deleted, a snapshot taken. What must
hold after each is in tests/nodekill.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nodekill import Trio, kill_during, trio_of

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    with trio_of() as three:
        yield three


@pytest.mark.parametrize(
    "failpoint",
    [
        "stop_compute:signalled",
        "apply_config:executed",
        "restart_compute:signalled",
        "create_timeline:populated",
        "delete_timeline:stopped",
        "delete_tenant:stopped",
        "create_snapshot:built",
        "after:create_branch",
        "after:start_compute",
    ],
)
def test_node_c_killed_inside_an_operation(trio: Trio, failpoint: str) -> None:
    kill_during(trio, failpoint)
