"""Operations that can never succeed end, and hold nothing up while they try.

A poison step (it raises every time: a failpoint armed to ``raise``) and a hung one (it never
returns: a failpoint left waiting, cut off by the engine's ``attempt_timeout_seconds``) run on
a real server beside a project with nothing wrong. Each stuck operation is retried with growing
gaps, ends ``failed`` with its reason, and then lets its project's later operations run; the
healthy project's operations run meanwhile.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

from tests.crash import unsettled
from tests.support import Api, running_server

MAX_ATTEMPTS = 3
RETRY_BASE = 0.5
ATTEMPT_TIMEOUT = 1
ENV = {
    # create_branch always raises; suspend_compute never returns.
    "PGPLANE_FAILPOINTS": "before:create_branch=raise,before:suspend_compute",
    "PGPLANE_MAX_ATTEMPTS": str(MAX_ATTEMPTS),
    "PGPLANE_RETRY_BASE_SECONDS": str(RETRY_BASE),
    "PGPLANE_ATTEMPT_TIMEOUT_SECONDS": str(ATTEMPT_TIMEOUT),
}


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


class Watch(threading.Thread):
    """Polls one operation until it settles, keeping each state it was seen in."""

    def __init__(self, api: Api, project_id: str, op_id: str) -> None:
        super().__init__()
        self.api, self.project_id, self.op_id = api, project_id, op_id
        self.seen: dict[tuple[str, int], dict[str, Any]] = {}
        self.last: dict[str, Any] = {}

    def run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            r = self.api.http.get(f"/projects/{self.project_id}/operations/{self.op_id}")
            op = r.json()["operation"]
            self.seen.setdefault((op["status"], op["failures_count"]), op)
            self.last = op
            if op["status"] in ("finished", "failed"):
                return
            time.sleep(0.05)

    def gaps(self) -> list[float]:
        """Seconds from each failed attempt to the retry it scheduled."""
        waits = sorted(
            (n, _seconds(op["retry_at"]) - _seconds(op["updated_at"]))
            for (status, n), op in self.seen.items()
            if status == "scheduling" and n > 0
        )
        return [round(gap, 3) for _, gap in waits]


def _ids(body: dict[str, Any]) -> list[str]:
    return [o["id"] for o in body["operations"]]


def _accepted(api: Api, method: str, path: str, **body: Any) -> list[str]:
    r = api.http.request(method, path, json=body or None)
    assert r.status_code in (200, 201), r.text
    return _ids(r.json())


def test_poison_and_hung_operations_fail_in_the_end_and_block_nobody_else() -> None:
    with running_server() as server:
        _, key = server.create_key("stuck@example.com")
        with Api(server, key) as api:
            bodies = [api.create_project(name=name) for name in ("poison", "hung", "healthy")]
            for body in bodies:  # created together, settled together
                ops = api.wait_operations(body["project"]["id"], _ids(body))
                assert [o["status"] for o in ops] == ["finished"] * len(ops), ops
            # Armed only now: a first project's creation (initdb) may take longer than the
            # short time limit given to attempts here.
            server.stop()
            server.env.update(ENV)
            server.start()
            poison, hung, healthy = (b["project"]["id"] for b in bodies)
            hung_endpoint = bodies[1]["endpoints"][0]["id"]

            (branch_op,) = _accepted(
                api, "POST", f"/projects/{poison}/branches", branch={"name": "never"}
            )
            (suspend_op,) = _accepted(
                api, "POST", f"/projects/{hung}/endpoints/{hung_endpoint}/suspend"
            )
            watches = [Watch(api, poison, branch_op), Watch(api, hung, suspend_op)]
            for watch in watches:
                watch.start()
            # Queued behind the stuck ones (project-wide work overlaps everything in its project).
            retention = {"project": {"history_retention_seconds": 7200}}
            poison_later = _accepted(api, "PATCH", f"/projects/{poison}", **retention)
            hung_later = _accepted(api, "POST", f"/projects/{hung}/endpoints/{hung_endpoint}/start")
            # Another project's operation, queued after both.
            healthy_ops = _accepted(api, "PATCH", f"/projects/{healthy}", **retention)
            (healthy_done,) = api.wait_operations(healthy, healthy_ops)
            for watch in watches:
                watch.join()

            # The healthy project's operation ran while both stuck ones were still retrying.
            assert healthy_done["status"] == "finished"
            for watch in watches:
                assert _seconds(healthy_done["updated_at"]) < _seconds(watch.last["updated_at"])

            # Each stuck operation: every attempt made, gaps doubling, failed with its reason.
            expected_gaps = [RETRY_BASE * 2**i for i in range(MAX_ATTEMPTS - 1)]
            reasons = {
                branch_op: "internal error: FailpointError: failpoint before:create_branch raised",
                suspend_op: f"suspend_compute timed out after {ATTEMPT_TIMEOUT} s",
            }
            for watch in watches:
                final = watch.last
                assert final["status"] == "failed", watch.seen
                assert final["failures_count"] == MAX_ATTEMPTS
                assert final["error"] == reasons[watch.op_id]
                assert "retry_at" not in final
                assert watch.gaps() == expected_gaps, watch.seen
            # Each hung attempt was cut off and a new one started: the failpoint was reached
            # once per attempt.
            log = server.log()
            assert log.count("failpoint before:suspend_compute reached") == MAX_ATTEMPTS

            # Their projects are free again: what queued behind them ran.
            later = api.wait_operations(poison, poison_later) + api.wait_operations(
                hung, hung_later
            )
            assert [o["status"] for o in later] == ["finished", "finished"], later
            endpoint = api.http.get(f"/projects/{hung}/endpoints/{hung_endpoint}").json()
            assert endpoint["endpoint"]["current_state"] == "active"
            assert "pending_state" not in endpoint["endpoint"]
            # The branch that could not be made can be deleted.
            branches = api.http.get(f"/projects/{poison}/branches").json()["branches"]
            never = next(b for b in branches if b["name"] == "never")
            deleted = _accepted(api, "DELETE", f"/projects/{poison}/branches/{never['id']}")
            assert [o["status"] for o in api.wait_operations(poison, deleted)] == ["finished"]
            assert unsettled(server) == []
