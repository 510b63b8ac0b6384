"""Expiry latency: from a branch's ``expires_at`` until its ``delete_timeline`` finished.

On a real ``pgplane serve`` with the scheduler's tick as configured (``--tick``, the default 1 s,
``PGPLANE_SCHEDULER_SECONDS``): branches of one project, each with a running compute, set to
expire a few seconds apart; the operations list is read until every one's deletion finished, and
each latency is the deletion's finish (its ``updated_at``) minus ``expires_at``. Printed beside
the tick it waits for and the deletion's own duration (``total_duration_ms``: stopping the
compute, removing the data).

Then the same across a restart: ``serve`` stopped, more branches expire meanwhile, and the
latency is counted from the moment it answers again.

Target: every deletion finished within 60 s of its time (the README's promise), and after a
restart within 60 s of the start.

    .venv/bin/python -m bench.expiry [--branches 10] [--tick 1.0] [--after-restart 3] [--smoke]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.common import Api, median, parse_with_smoke, percentile, running_server, verdict
from pgplane.core import clock

_US = 1_000_000


def _expiring(api: Api, pid: str, name: str, at_us: int) -> tuple[str, int]:
    at = clock.format_s(at_us)
    r = api.http.post(
        f"/projects/{pid}/branches",
        json={"branch": {"name": name, "expires_at": at}, "endpoints": [{"type": "read_write"}]},
    )
    body = api.settled(pid, r)
    return body["branch"]["id"], clock.parse_us(at)


def _finished_deletions(api: Api, pid: str, want: set[str]) -> dict[str, dict[str, Any]]:
    """The deletion of each branch in ``want``, once every one has finished."""
    deadline = time.monotonic() + 300
    while True:
        found = {
            o["branch_id"]: o
            for o in api.operations(pid)
            if o["action"] == "delete_timeline" and o["branch_id"] in want
        }
        if set(found) == want and all(o["status"] == "finished" for o in found.values()):
            return found
        if time.monotonic() > deadline:
            raise SystemExit(f"deletions not finished in 300 s: {found}")
        time.sleep(0.1)


def _report(label: str, latencies: list[float], durations: list[float]) -> None:
    print(
        f"{label}: n={len(latencies)} p50 {median(latencies):.2f} s, p90"
        f" {percentile(latencies, 0.9):.2f} s, max {max(latencies):.2f} s after expires_at;"
        f" the deletion itself p50 {median(durations):.2f} s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--branches", type=int, default=10)
    parser.add_argument("--tick", type=float, default=1.0, help="PGPLANE_SCHEDULER_SECONDS")
    parser.add_argument("--after-restart", type=int, default=3)
    parser.add_argument("--lead", type=int, default=5, help="s before the first is due")
    args = parse_with_smoke(parser, branches=1, after_restart=1)

    with running_server(PGPLANE_SCHEDULER_SECONDS=str(args.tick)) as server:
        _, key = server.create_key("bench-expiry@example.com")
        with Api(server, key) as api:
            pid = api.create_ready_project(name="expiry")["project"]["id"]
            # Whole seconds (as Neon keeps them), far enough ahead to make every branch first.
            first = (clock.now_us() // _US + args.lead + 3 * args.branches) * _US
            due = dict(
                _expiring(api, pid, f"preview-{i}", first + 2 * i * _US)
                for i in range(args.branches)
            )
            done = _finished_deletions(api, pid, set(due))
            latencies = [(clock.parse_us(o["updated_at"]) - due[b]) / _US for b, o in done.items()]
            durations = [o["total_duration_ms"] / 1000 for o in done.values()]

            later = (clock.now_us() // _US + args.lead + 3 * args.after_restart) * _US
            waiting = dict(
                _expiring(api, pid, f"overnight-{i}", later) for i in range(args.after_restart)
            )
            server.stop()
            time.sleep(max(0.0, (later - clock.now_us()) / _US) + 2)
            server.start()
            started = clock.now_us()
            after = _finished_deletions(api, pid, set(waiting))
            restart = [(clock.parse_us(o["updated_at"]) - started) / _US for o in after.values()]
            restart_durations = [o["total_duration_ms"] / 1000 for o in after.values()]

    print(f"scheduler tick: {args.tick:.2f} s (PGPLANE_SCHEDULER_SECONDS)")
    _report("expiry latency", latencies, durations)
    print(
        f"due while serve was down: n={len(restart)}, max {max(restart):.2f} s after it"
        f" answered again; the deletion itself p50 {median(restart_durations):.2f} s"
    )
    return verdict(
        {
            "every deletion finished within 60 s of expires_at": max(latencies) < 60,
            "after a restart, within 60 s of the start": max(restart) < 60,
        },
        smoke=args.smoke,
    )


if __name__ == "__main__":
    raise SystemExit(main())
