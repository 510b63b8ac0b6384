"""Neon's consumption history (issue 23): the project's hourly figures in Neon's shape, read by
Neon's own clients (``@neondatabase/api-client`` under node, the ``neon-api`` Python SDK)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from neon_api import NeonAPI
from neon_api.exceptions import NeonAPIError
from neon_api.schema import (
    ConsumptionHistoryGranularity,
    ConsumptionHistoryPerProjectResponse,
)

from pgplane.core import clock
from tests import apiclient
from tests.stores import server_store
from tests.support import Api, Server, running_server, wait_for

# On the SQLite and the PostgreSQL store: the tests that use the shared server run on each.
pytestmark = pytest.mark.both_stores

PATH = "/consumption_history/v2/projects"
METRICS = "compute_unit_seconds,root_branch_bytes_month,instant_restore_bytes_month"
HOUR = 3600 * 1_000_000


@pytest.fixture(scope="module")
def server(store_backend: str) -> Iterator[Server]:
    with running_server(store=server_store(store_backend), PGPLANE_USAGE_SECONDS="0.3") as srv:
        yield srv


@pytest.fixture(scope="module")
def api(server: Server) -> Iterator[Api]:
    _, key = server.create_key("consumption@example.com")
    with Api(server, key) as client:
        yield client


def _hours() -> tuple[str, str]:
    """From two hours back to the next hour: the current hour is the range's last."""
    now = clock.now_us()
    return clock.format_s(now - 2 * HOUR), clock.format_s(now + HOUR)


def _metrics(frame: dict[str, Any]) -> dict[str, int]:
    return {m["metric_name"]: m["value"] for m in frame["metrics"]}


@pytest.fixture(scope="module")
def project(api: Api, server: Server) -> dict[str, Any]:
    body = api.create_ready_project(autoscaling_limit_min_cu=1, autoscaling_limit_max_cu=1)
    pid = body["project"]["id"]
    uri = body["connection_uris"][0]["connection_uri"]
    with psycopg.connect(uri, connect_timeout=60, autocommit=True) as conn:
        conn.execute("SELECT sum(sqrt(g)) FROM generate_series(1, 5000000) g")
        # And runs two wall seconds at least: the figures are whole seconds, and a quiet
        # machine's query alone took 0.6 s (its compute time then 0).
        conn.execute("SELECT pg_sleep(2)")
    api.suspend(pid, body["endpoints"][0]["id"])
    start, end = _hours()

    seen: dict[str, int] = {}

    def figures() -> dict[str, int] | None:
        r = api.http.get(
            PATH,
            params={"from": start, "to": end, "granularity": "hourly", "metrics": METRICS,
                    "project_ids": pid},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        totals: dict[str, int] = {}
        for frame in r.json()["projects"][0]["periods"][0]["consumption"]:
            for name, value in _metrics(frame).items():
                totals[name] = totals.get(name, 0) + value
        seen.update(totals)
        return totals if all(totals.get(m, 0) > 0 for m in METRICS.split(",")) else None

    # Compute time is recorded with the suspend; storage once sampled twice (integrated).
    try:
        body["totals"] = wait_for("the project's hourly figures", figures, 60, server=server)
    except AssertionError as e:
        raise AssertionError(f"{e}\nthe last figures: {seen}") from None
    return body


def test_the_reply_is_neon_s_shape_in_hourly_timeframes(api: Api, project: dict) -> None:
    pid = project["project"]["id"]
    start, end = _hours()
    r = api.http.get(
        PATH,
        params=[("from", start), ("to", end), ("granularity", "hourly"), ("project_ids", pid),
                ("metrics", "compute_unit_seconds"), ("metrics", "active_time_seconds")],
    )  # fmt: skip
    assert r.status_code == 200, r.text
    body = r.json()
    assert [p["project_id"] for p in body["projects"]] == [pid]
    (period,) = body["projects"][0]["periods"]
    assert set(period) >= {"period_id", "period_plan", "period_start", "consumption"}
    frames = period["consumption"]
    assert frames, period
    for frame in frames:
        begin, finish = (
            clock.parse_us(frame["timeframe_start"]),
            clock.parse_us(frame["timeframe_end"]),
        )
        assert finish - begin == HOUR and begin % HOUR == 0
        assert [m["metric_name"] for m in frame["metrics"]] == [
            "compute_unit_seconds", "active_time_seconds"
        ]  # fmt: skip
    starts = [f["timeframe_start"] for f in frames]
    assert starts == sorted(starts)
    # 1 CU: compute-unit seconds are the seconds it ran.
    cu = sum(_metrics(f)["compute_unit_seconds"] for f in frames)
    active = sum(_metrics(f)["active_time_seconds"] for f in frames)
    assert cu >= 1 and abs(cu - active) <= len(frames)
    shown = api.http.get(f"/projects/{pid}").json()["project"]
    assert abs(shown["compute_time_seconds"] - cu) <= len(frames)


def test_daily_and_monthly_sum_the_hours(api: Api, project: dict) -> None:
    pid = project["project"]["id"]
    now = clock.now_us()
    for granularity, span in (("daily", 24 * HOUR), ("monthly", 32 * 24 * HOUR)):
        r = api.http.get(
            PATH,
            params={"from": clock.format_s(now - span), "to": clock.format_s(now + span),
                    "granularity": granularity, "metrics": METRICS, "project_ids": pid},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        frames = r.json()["projects"][0]["periods"][0]["consumption"]
        cu = sum(_metrics(f)["compute_unit_seconds"] for f in frames)
        assert cu >= project["totals"]["compute_unit_seconds"]


def test_bad_queries_are_refused_with_reasons(api: Api, project: dict) -> None:
    start, end = _hours()
    base = {"from": start, "to": end, "granularity": "hourly", "metrics": METRICS}
    cases = [
        ({"granularity": "weekly"}, 400, "granularity"),
        ({"metrics": "public_network_transfer_bytes"}, 400, "not measured"),
        ({"metrics": "bogus"}, 400, "unknown metrics"),
        ({"from": "yesterday"}, 400, "RFC 3339"),
        ({"to": start}, 406, "timeframe"),
        ({"from": clock.format_s(clock.now_us() - 200 * HOUR)}, 406, "168"),
        ({"org_id": "org-nothing-12345678"}, 404, "organization"),
        ({"limit": "0"}, 400, "limit"),
    ]
    for change, status, says in cases:
        r = api.http.get(PATH, params={**base, **change})
        assert r.status_code == status, (change, r.text)
        assert says in r.json()["message"], (change, r.text)
    r = api.http.get(PATH, params={"from": start, "to": end, "granularity": "hourly"})
    assert r.status_code == 400, r.text  # metrics is required


def test_another_account_s_project_is_left_out_as_one_that_does_not_exist(
    server: Server, project: dict
) -> None:
    _, key = server.create_key("consumption-other@example.com")
    start, end = _hours()
    with Api(server, key) as other:
        for pid in (project["project"]["id"], "nothing-here-12345678"):
            r = other.http.get(
                PATH,
                params={"from": start, "to": end, "granularity": "hourly", "metrics": METRICS,
                        "project_ids": pid},
            )  # fmt: skip
            assert r.status_code == 200 and r.json()["projects"] == [], r.text


def test_pages_follow_the_cursor(api: Api, project: dict) -> None:
    api.create_project()  # a second project, newest: first on the first page
    now = clock.now_us()
    start, end = clock.format_s(now - 24 * HOUR), clock.format_s(now + 24 * HOUR)
    seen: list[str] = []
    cursor = None
    for _ in range(5):
        params = {
            "from": start,
            "to": end,
            "granularity": "daily",
            "metrics": METRICS,
            "limit": "1",
        }
        if cursor:
            params["cursor"] = cursor
        body = api.http.get(PATH, params=params).json()
        seen += [p["project_id"] for p in body["projects"]]
        cursor = (body.get("pagination") or {}).get("cursor")
        if not cursor:
            break
    assert project["project"]["id"] in seen and len(seen) == len(set(seen)) == 2


def test_neon_s_typescript_client_reads_it(server: Server, api: Api, project: dict) -> None:
    prefix = apiclient.install()
    start, end = _hours()
    script = """
const { createApiClient } = require("@neondatabase/api-client");
const client = createApiClient({ apiKey: process.env.KEY, baseURL: process.env.BASE });
(async () => {
  const r = await client.getConsumptionHistoryPerProjectV2({
    from: process.env.FROM, to: process.env.TO, granularity: "hourly",
    metrics: ["compute_unit_seconds", "root_branch_bytes_month", "instant_restore_bytes_month"],
    project_ids: [process.env.PROJECT],
  });
  const out = {};
  for (const p of r.data.projects)
    for (const period of p.periods)
      for (const frame of period.consumption)
        for (const m of frame.metrics) out[m.metric_name] = (out[m.metric_name] || 0) + m.value;
  console.log(JSON.stringify({ status: r.status, project: r.data.projects[0].project_id, out }));
})().catch((e) => { console.error(e.response ? e.response.data : e); process.exit(1); });
"""
    got = apiclient.run(
        prefix,
        script,
        {"KEY": api.key, "BASE": server.base_url, "FROM": start, "TO": end,
         "PROJECT": project["project"]["id"]},
    )  # fmt: skip
    assert got["status"] == 200 and got["project"] == project["project"]["id"]
    assert got["out"]["compute_unit_seconds"] >= project["totals"]["compute_unit_seconds"]
    assert got["out"]["root_branch_bytes_month"] > 0
    assert got["out"]["instant_restore_bytes_month"] > 0


def test_neon_s_python_sdk_reads_it(server: Server, api: Api, project: dict) -> None:
    """As far as ``neon-api`` 0.3 goes: it has no consumption method, and its consumption models
    are the legacy API's (a timeframe of named fields, where v2 has a list of metrics). Its own
    methods and models read the project's and the branch's figures; its request path asks for
    v2 at each of its granularities; its models read the v2 envelope (projects, periods) with
    the timeframes, which @neondatabase/api-client parses above, checked here by hand."""
    neon = NeonAPI(api.key, base_url=server.base_url + "/")
    pid, bid = project["project"]["id"], project["branch"]["id"]
    shown = neon.project(pid).project  # the SDK's method, parsed by its ProjectResponse
    assert shown.compute_time_seconds >= 1 and shown.active_time_seconds >= 1
    assert shown.synthetic_storage_size and shown.data_storage_bytes_hour > 0
    branch = neon.branch(pid, bid).branch  # its BranchResponse: Neon's names, on the branch
    assert branch.compute_time_seconds == shown.compute_time_seconds  # its only compute
    assert branch.active_time_seconds == shown.active_time_seconds
    assert branch.logical_size

    now = clock.now_us()
    spans = {"hourly": 2 * HOUR, "daily": 24 * HOUR, "monthly": 32 * 24 * HOUR}
    for granularity in ConsumptionHistoryGranularity:
        span = spans[granularity.value]
        body = neon._request(
            "GET",
            PATH.lstrip("/"),
            params={"from": clock.format_s(now - span), "to": clock.format_s(now + span),
                    "granularity": granularity.value, "metrics": METRICS, "project_ids": pid},
        )  # fmt: skip
        envelope = ConsumptionHistoryPerProjectResponse(
            projects=[
                {**p, "periods": [{**period, "consumption": []} for period in p["periods"]]}
                for p in body["projects"]
            ]
        )
        [found] = envelope.projects
        [period] = found.periods
        assert found.project_id == pid and period.period_start <= clock.format_s(now)
        frames = body["projects"][0]["periods"][0]["consumption"]
        assert all(
            {m["metric_name"] for m in frame["metrics"]} == set(METRICS.split(","))
            for frame in frames
        ), frames
        # 1 CU: its compute-unit seconds are the compute time the SDK's project shows.
        cu = sum(_metrics(frame)["compute_unit_seconds"] for frame in frames)
        assert abs(cu - shown.compute_time_seconds) <= len(frames), (granularity, frames)

    # A refusal reaches the SDK as its error, carrying the API's JSON body and reason.
    start, end = _hours()
    with pytest.raises(NeonAPIError) as refused:
        neon._request(
            "GET", PATH.lstrip("/"), params={"from": start, "to": end, "granularity": "hourly"}
        )
    error = json.loads(str(refused.value))
    assert error["code"] == "BAD_REQUEST" and "'metrics'" in error["message"], error


def test_a_suspended_compute_adds_nothing(server: Server, api: Api, project: dict) -> None:
    pid = project["project"]["id"]
    now = clock.now_us()
    start, end = clock.format_s(now - 24 * HOUR), clock.format_s(now + 24 * HOUR)
    params = {"from": start, "to": end, "granularity": "daily", "metrics": "compute_unit_seconds",
              "project_ids": pid}  # fmt: skip
    first = api.http.get(PATH, params=params).json()
    server.wait_for_ticks(3)  # each starts a usage sample (unless one still runs)
    assert api.http.get(PATH, params=params).json() == first


BRANCHES = "/consumption_history/v2/branches"
BRANCH_METRICS = "compute_unit_seconds,root_branch_bytes_month,child_branch_bytes_month"


def _by_branch(body: dict[str, Any]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for b in body["branches"]:
        totals = out.setdefault(b["branch_id"], {})
        for frame in b["periods"][0]["consumption"]:
            for name, value in _metrics(frame).items():
                totals[name] = totals.get(name, 0) + value
    return out


def test_per_branch_root_and_child_apart(api: Api, server: Server, project: dict) -> None:
    pid, root = project["project"]["id"], project["branch"]["id"]
    child = api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={"branch": {}}))[
        "branch"
    ]["id"]
    start, end = _hours()
    params = {"from": start, "to": end, "granularity": "hourly", "metrics": BRANCH_METRICS,
              "project_ids": pid}  # fmt: skip

    def both() -> dict[str, dict[str, int]] | None:
        r = api.http.get(BRANCHES, params=params)
        assert r.status_code == 200, r.text
        found = _by_branch(r.json())
        return found if found.get(child, {}).get("child_branch_bytes_month", 0) > 0 else None

    # The new branch's storage counts once it was sampled twice (a full pass every 10 ticks).
    found = wait_for("the child branch's storage", both, timeout=60)
    assert found[root]["root_branch_bytes_month"] > 0
    assert found[root]["child_branch_bytes_month"] == 0 == found[child]["root_branch_bytes_month"]
    assert found[root]["compute_unit_seconds"] >= project["totals"]["compute_unit_seconds"]
    # Pages of one, by branch id within the project, follow the cursor.
    seen, cursor = [], None
    for _ in range(4):
        paged = {**params, "limit": "1", **({"cursor": cursor} if cursor else {})}
        page = api.http.get(BRANCHES, params=paged).json()
        seen += [b["branch_id"] for b in page["branches"]]
        cursor = (page.get("pagination") or {}).get("cursor")
        if not cursor:
            break
    assert seen == sorted([root, child])
    for bad, says in (
        ({"project_ids": ""}, "project_ids"),
        ({"metrics": "cpu_seconds"}, "unknown"),
    ):
        r = api.http.get(BRANCHES, params={**params, **bad})
        assert r.status_code == 400 and says in r.json()["message"], r.text
    script = """
const { createApiClient } = require("@neondatabase/api-client");
const client = createApiClient({ apiKey: process.env.KEY, baseURL: process.env.BASE });
(async () => {
  const r = await client.getConsumptionHistoryPerBranchV2({
    from: process.env.FROM, to: process.env.TO, granularity: "daily",
    metrics: ["compute_unit_seconds", "child_branch_bytes_month"],
    project_ids: [process.env.PROJECT],
  });
  console.log(JSON.stringify(r.data.branches.map((b) => [b.project_id, b.branch_id])));
})().catch((e) => { console.error(e.response ? e.response.data : e); process.exit(1); });
"""
    now = clock.now_us()
    got = apiclient.run(
        apiclient.install(),
        script,
        {"KEY": api.key, "BASE": server.base_url, "FROM": clock.format_s(now - 24 * HOUR),
         "TO": clock.format_s(now + 24 * HOUR), "PROJECT": pid},
    )  # fmt: skip
    assert got == [[pid, b] for b in sorted([root, child])]


def test_the_v1_history_has_the_same_hours_as_fields(
    server: Server, api: Api, project: dict
) -> None:
    """``GET /consumption_history/projects``, Neon's older form (its SDKs still call it): each
    timeframe's figures as fields, which ``neon-api``'s models (the legacy ones) parse whole;
    the WAL the computes wrote counts as written data."""
    pid = project["project"]["id"]
    with psycopg.connect(project["connection_uris"][0]["connection_uri"], autocommit=True) as c:
        c.execute("CREATE TABLE written AS SELECT g, repeat('x', 100) AS pad"
                  " FROM generate_series(1, 20000) g")  # fmt: skip
    start, end = _hours()

    def v1(**params: str) -> Any:
        r = api.http.get(
            "/consumption_history/projects",
            params={"from": start, "to": end, "granularity": "hourly", "project_ids": pid,
                    **params},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()

    def written() -> int | None:
        frames = v1()["projects"][0]["periods"][0]["consumption"]
        total = sum(f["written_data_bytes"] for f in frames)
        return total if total > 2_000_000 else None  # the table's ~2.5 MB of WAL, at least

    wait_for("the WAL written, sampled", written, 60, server=server)
    body = v1(metrics="logical_size_bytes,data_storage_bytes_hour")
    parsed = ConsumptionHistoryPerProjectResponse(**body)  # neon-api's own models, whole
    [period] = parsed.projects[0].periods
    frames = body["projects"][0]["periods"][0]["consumption"]
    assert set(frames[-1]) == {
        "timeframe_start", "timeframe_end", "active_time_seconds", "compute_time_seconds",
        "written_data_bytes", "synthetic_storage_size_bytes", "data_storage_bytes_hour",
        "logical_size_bytes",
    }  # fmt: skip
    assert len(period.consumption) == len(frames)
    assert max(f["logical_size_bytes"] for f in frames) > 0
    assert sum(f["data_storage_bytes_hour"] for f in frames) > 0
    # The same hours as v2's: compute time is its compute-unit seconds.
    r = api.http.get(
        PATH,
        params={"from": start, "to": end, "granularity": "hourly", "project_ids": pid,
                "metrics": "compute_unit_seconds"},
    )  # fmt: skip
    v2 = [
        _metrics(f)["compute_unit_seconds"]
        for f in r.json()["projects"][0]["periods"][0]["consumption"]
    ]
    assert [f["compute_time_seconds"] for f in frames] == v2
    # The deprecated switch adds data_storage_bytes_hour; an unknown metric is refused by name.
    assert (
        "data_storage_bytes_hour"
        in v1(include_v1_metrics="true")["projects"][0]["periods"][0]["consumption"][0]
    )
    r = api.http.get(
        "/consumption_history/projects",
        params={"from": start, "to": end, "granularity": "hourly", "metrics": "cpu_seconds"},
    )
    assert r.status_code == 400 and "cpu_seconds" in r.json()["message"], r.text
