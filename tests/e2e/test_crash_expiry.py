"""``pgplane serve`` killed while it deletes an expired branch: the deletion converges, once.

The kill lands where the scheduler found the branch due but recorded nothing yet
(``expire_branch:due``), inside the deletion it started (``delete_timeline:stopped``: the
branch's compute stopped, its files still there) and after it (``after:delete_timeline``).
After the restart the branch is gone with exactly one ``delete_timeline``, finished, and the
parent's compute ran through it all untouched.
"""

from __future__ import annotations

import pytest

from pgplane.core import clock
from tests.crash import ROWS, SUM, Crash, assert_consistent, slow
from tests.support import wait_for

_US = 1_000_000


@pytest.mark.parametrize(
    "failpoint", ["expire_branch:due", "delete_timeline:stopped", slow("after:delete_timeline")]
)
def test_kill_while_an_expired_branch_is_deleted(crash: Crash, failpoint: str) -> None:
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branches",
        json={"branch": {"name": "preview"}, "endpoints": [{"type": "read_write"}]},
    )
    assert r.status_code == 201, r.text
    child = r.json()["branch"]["id"]
    crash.settle([o["id"] for o in r.json()["operations"]])
    crash.arm(failpoint)
    soon = clock.format_s(clock.now_us() + 2 * _US)
    r = crash.api.http.patch(
        f"/projects/{crash.pid}/branches/{child}", json={"branch": {"expires_at": soon}}
    )
    assert r.status_code == 200, r.text
    crash.kill_at(failpoint)

    def deletions() -> list[dict[str, object]]:
        return [
            o for o in crash.ops() if o["action"] == "delete_timeline" and o["branch_id"] == child
        ]

    wait_for("the deletion recorded", deletions, server=crash.server)
    crash.settle([str(o["id"]) for o in deletions()])
    assert len(deletions()) == 1
    assert crash.api.http.get(f"/projects/{crash.pid}/branches/{child}").status_code == 404
    left = crash.pgdata(child).parent
    assert not left.exists(), sorted(str(p) for p in left.rglob("*"))[:20]
    crash.assert_adopted(crash.pgdata())
    assert_consistent(crash.server, crash.api, crash.pid)
    assert crash.rows() == (ROWS, SUM)
    assert len(deletions()) == 1  # later ticks found nothing more to do
