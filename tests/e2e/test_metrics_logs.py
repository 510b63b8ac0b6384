"""``GET /metrics`` and ``--log-format json`` on a real server: figures that count what the
platform did, read with Prometheus' own parser, and log lines that name who wrote them."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from tests import pgclient
from tests.support import PGPLANE, Api, Server, running_server, wait_for

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
# Every label the exposition may have: each takes values from a small fixed set (``node``: the
# one name of the process).
BOUNDED_LABELS = {"action", "status", "state", "reason", "version", "le", "node"}


def _scrape(server: Server) -> tuple[str, Samples]:
    """The exposition, fetched as Prometheus does (no key), and its samples as parsed."""
    r = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain; version="), r.headers
    samples: Samples = {}
    for family in text_string_to_metric_families(r.text):
        for sample in family.samples:
            assert set(sample.labels) <= BOUNDED_LABELS, sample
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return r.text, samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _ops(samples: Samples, action: str, status: str = "finished") -> float:
    return _value(samples, "pgplane_operations_total", action=action, status=status)


def _grew(server: Server, before: Samples, want: dict[str, float], **labels: str) -> Samples:
    """The samples once each of ``want`` (name -> increase, with ``labels``) has grown so."""

    def check() -> Samples | None:
        _, now = _scrape(server)
        grown = all(
            _value(now, name, **labels) - _value(before, name, **labels) == by
            for name, by in want.items()
        )
        return now if grown else None

    found: Samples = wait_for(f"{want} to grow", check, server=server)
    return found


def test_metrics_count_operations_wakes_and_proxy_logins() -> None:
    with running_server() as server:
        _, key = server.create_key("metrics@example.com")
        with Api(server, key) as api:
            _, before = _scrape(server)
            project = api.create_ready_project(name="metrics")
            pid, eid = project["project"]["id"], project["endpoints"][0]["id"]
            params = project["connection_uris"][0]["connection_parameters"]

            def ops_counted() -> Samples | None:
                _, now = _scrape(server)
                done = _ops(now, "create_timeline") - _ops(before, "create_timeline") == 1
                done &= _ops(now, "start_compute") - _ops(before, "start_compute") == 1
                return now if done else None

            after = wait_for("the operations counted", ops_counted, server=server)
            for action in ("create_timeline", "start_compute"):
                assert _ops(after, action, "failed") == _ops(before, action, "failed") == 0
                count = "pgplane_operation_duration_seconds_count"
                assert (
                    _value(after, count, action=action) == _value(before, count, action=action) + 1
                )
            # The scheduler's tick counts the compute as active.
            wait_for(
                "the active compute counted",
                lambda: _value(_scrape(server)[1], "pgplane_computes", state="active") == 1,
                server=server,
            )

            # A wrong password through the proxy is an authentication failure.
            wrong = pgclient.refusal(
                server.proxy_port, endpoint=eid, user=params["role"], password="not-it"
            )
            assert wrong is not None and "password authentication failed" in wrong
            after = _grew(server, after, {"pgplane_proxy_auth_failures_total": 1})

            # A suspended compute woken by a login: a wake, a session open then closed.
            api.suspend(pid, eid)
            uri = project["connection_uris"][0]["connection_uri"]
            with psycopg.connect(uri, connect_timeout=60) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
                during = _grew(
                    server,
                    after,
                    {
                        "pgplane_proxy_connections_total": 1,
                        "pgplane_compute_wake_seconds_count": 1,
                    },
                )
                assert _value(during, "pgplane_proxy_open_connections") == 1
            _grew(server, during, {"pgplane_proxy_open_connections": -1})
            # The wake was a start_compute of its own, after the suspend.
            final = _grew(
                server,
                before,
                {"pgplane_operations_total": 2},
                action="start_compute",
                status="finished",
            )
            assert _ops(final, "suspend_compute") == _ops(before, "suspend_compute") + 1
            assert _value(final, "pgplane_compute_wake_failures_total") == 0
            assert _value(final, "pgplane_proxy_auth_failures_total") == 1

            text, final = _scrape(server)
            # No tenant's id anywhere in what any caller of the port may read.
            for tenant_id in (pid, eid, project["branch"]["id"], params["role"]):
                assert tenant_id not in text
            # The node is named, its heartbeat recorded a moment ago.
            assert len([k for k in final if k[0] == "pgplane_node_info"]) == 1
            assert _value(final, "pgplane_node_heartbeat_age_seconds") < 60
            # Store writes and scheduler ticks were timed.
            assert _value(final, "pgplane_store_write_seconds_count") > 0
            assert _value(final, "pgplane_scheduler_lag_seconds_count") > 0


def _lines(server: Server) -> list[dict[str, Any]]:
    """The server's log, every line of it a JSON object."""
    lines = []
    for line in server.log().splitlines():
        entry = json.loads(line)
        assert isinstance(entry, dict), line
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        lines.append(entry)
    # Past the first lines (the node's name is known once the settings are read), every line
    # names the node that wrote it.
    named = [e for e in lines if "node" in e]
    assert named, lines[:5]
    assert lines[lines.index(named[0]) :] == named
    assert len({e["node"] for e in named}) == 1
    return lines


def test_json_log_lines_carry_the_request_and_operation_that_wrote_them() -> None:
    with running_server(PGPLANE_LOG_FORMAT="json", PGPLANE_METRICS="off") as server:
        # Metrics off: no /metrics at all, the JSON error body as for any unknown path.
        r = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10)
        assert r.status_code == 404
        assert r.json()["code"]

        _, key = server.create_key("logs@example.com")
        request_id = f"logs-test-{uuid.uuid4().hex}"
        with Api(server, key) as api:
            r = api.http.post(
                "/projects",
                json={"project": {"name": "logs"}},
                headers={"X-Request-ID": request_id},
            )
            body = api.settled(r.json()["project"]["id"], r)
        pid, eid = body["project"]["id"], body["endpoints"][0]["id"]
        ops = {o["action"]: o["id"] for o in body["operations"]}
        assert set(ops) == {"create_timeline", "start_compute"}

        for action, op_id in ops.items():

            def written(op_id: str = op_id, action: str = action) -> list[dict[str, Any]]:
                ran = [e for e in _lines(server) if e.get("operation_id") == op_id]
                return ran if any(f"{action} finished" in e["message"] for e in ran) else []

            lines = wait_for(f"{action}'s lines", written, server=server)
            # The request queued it: its line names both.
            queued = [e for e in lines if e["message"].endswith(f"{op_id} {action} queued")]
            assert len(queued) == 1, lines
            # The attempt's lines name the operation and the request that asked for it.
            for entry in lines:
                assert entry["request_id"] == request_id, entry
                assert entry["project_id"] == pid, entry
            if action == "start_compute":
                assert all(e.get("endpoint_id") == eid for e in lines), lines

        # A request's error body names the id its lines have; a key-like id is never taken.
        with httpx.Client(base_url=server.base_url, timeout=10) as anonymous:
            r = anonymous.get("/projects", headers={"X-Request-ID": "pgp_" + "a" * 60})
        assert r.status_code == 401
        assert not r.json()["request_id"].startswith("pgp_")


def test_a_bad_log_format_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [*PGPLANE, "serve", "--data-dir", str(tmp_path), "--log-format", "yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "expected text or json" in done.stderr
