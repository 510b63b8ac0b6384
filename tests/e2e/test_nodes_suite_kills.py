"""Node C of three killed in the middle of every other kind of operation (``-m slow``; CI runs
two kinds in test_nodes_suite.py): a compute suspended, a role made, new settings restarting a
compute, a project created on C, a branch and a project deleted, a snapshot taken and one
deleted, a history window changed, an availability check, a project detached to the archive and
brought back; and after the work of a branch and a start, before the store knew. The cases are
tests/nodekill_cases.py; what must hold after each is in tests/nodekill.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nodekill import kill_during
from tests.nodekill_cases import CASES
from tests.trio import Trio, trio_of

pytestmark = pytest.mark.slow

# CI's two (test_nodes_suite.py) apart.
FAILPOINTS = [f for f in CASES if f not in ("create_branch:copied", "start_compute:spawned")]


@pytest.fixture(scope="module")
def trio() -> Iterator[Trio]:
    with trio_of() as three:
        yield three


@pytest.mark.parametrize("failpoint", FAILPOINTS)
def test_node_c_killed_inside_an_operation(trio: Trio, failpoint: str) -> None:
    kill_during(trio, failpoint)
