"""A project's settings: what the platform enforces is checked as it is set."""

from __future__ import annotations

import pytest

from pgplane.errors import BadRequest
from pgplane.services import project_settings as ps


def test_logical_replication_is_a_boolean_that_stays_on() -> None:
    assert not ps.logical_replication(ps.new({}))
    on = ps.new({"enable_logical_replication": True})
    assert ps.logical_replication(on)
    assert ps.turns_on_logical_replication({}, on)
    assert not ps.turns_on_logical_replication(on, ps.updated(on, {"name": "x"}))
    # Sent again as it is, nothing changes.
    assert ps.updated(on, {"enable_logical_replication": True}) == on
    assert ps.updated({}, {"enable_logical_replication": False}) == {
        "enable_logical_replication": False
    }
    with pytest.raises(BadRequest, match="cannot be turned off"):
        ps.updated(on, {"enable_logical_replication": False})
    for bad in ("true", 1, None):
        with pytest.raises(BadRequest, match="enable_logical_replication: must be true or false"):
            ps.updated({}, {"enable_logical_replication": bad})
