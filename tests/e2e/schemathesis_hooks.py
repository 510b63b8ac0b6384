"""Hooks for the schemathesis runs of test_schemathesis.py (loaded by their ``hooks`` setting).

``PGPLANE_FUZZ_SEEDS`` (JSON) names the seeded ids, the object each destructive operation may
destroy instead, and the key the run authenticates with.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import schemathesis

from pgplane.services import compute_settings, consumption, expiry, history, names

_SEEDS: dict[str, Any] = json.loads(os.environ.get("PGPLANE_FUZZ_SEEDS", "{}"))
_BARE_BRANCHES = itertools.cycle(_SEEDS.get("bare_branches") or [None])
_ROLE = re.compile(names.IDENTIFIER_PATTERN)

# Rules a JSON Schema cannot state, so the document cannot either: a request that breaks one is
# schema-valid, and the platform is right to refuse it with a 400. Each is tested on its own
# (tests/e2e/test_bad_input.py and each resource's suite). For these reasons alone, and only on
# that response, a "schema-valid request rejected" (ST202) is not a failure.
OUTSIDE_JSON_SCHEMA = (
    # Postgres counts identifiers in bytes; JSON Schema counts characters.
    "must be at most 63 bytes",
    # One field bounded by another.
    "autoscaling_limit_min_cu must not exceed autoscaling_limit_max_cu",
    # A cursor is what a previous page returned, not any string of its type.
    "cursor must be the pagination",
    # Only the endpoint's own branch: which that is, is the endpoint's state.
    "moving a compute to another branch is not supported",
    # A setting's value as Postgres reads it: each setting's own type, unit, range or choices.
    compute_settings.SETTING_REFUSED,
    # Two fields of which one at most may be given (a null counts as not given).
    ", not both",
    # A point of history against the clock, the project's window and what the branch holds.
    "is in the future",
    "existed (it was created at",
    "outside the project's history window",
    "the project keeps no history",
    "never had this LSN",
    "is before the history of branch",
    "has no history yet",
    # An expiry against the clock, and what the branch is (default, protected, a parent).
    "expires_at must be in the future",
    "expires_at must be at most 30 days ahead",
    "cannot expire",
    f"clear its {expiry.FIELD} first",
    # A schema's database is asked for only once the branch is known to be the caller's (another
    # account's branch is the same 404, whatever is asked), and its base depends on its parent.
    "db_name is required: the database whose schema to read",
    "has no parent to compare with",
    # Only a branch a snapshot was restored into (and not finalized yet) can be finalized.
    "has no restore to finalize",
    "was finalized already",
    # What a restore needs depends on its source and on the branch's children.
    "is required to restore a branch from its own history",
    "preserve_under_name is required",
    # A consumption range: its ends against each other and the granularity (406, as Neon's),
    # and the years it may name.
    "timeframe after from",
    "timeframes: narrow it",
    "must be between the years 2000 and 9000",
    # Neon's pattern for project_ids lets an item be empty; per branch, one project is needed.
    "project_ids is required",
    # A masking rule's expression is read against the offered functions (core/masking.py), and
    # gives one of two fields; its column is named once.
    "masking_rules[",
)


def _fresh_key() -> int:
    """A key made for the occasion: what a revocation meant for the run's own key gets instead."""
    r = httpx.post(
        f"{_SEEDS['base_url']}/api_keys",
        json={"key_name": "stand-in"},
        headers={"Authorization": f"Bearer {_SEEDS['key']}"},
        timeout=30,
    )
    r.raise_for_status()
    return int(r.json()["id"])


def _label(ctx: schemathesis.HookContext) -> str:
    operation = ctx.operation
    return f"{operation.method.upper()} {operation.path}" if operation else ""


@schemathesis.hook
def before_call(ctx: schemathesis.HookContext, case: schemathesis.Case, kwargs: Any) -> None:
    """Just before each request, in every phase, as it will be sent: a destructive operation
    aimed at a seeded object takes its own victim instead, the run's own key is never revoked (a
    link may carry its id from the key list), and where seeded ids are in use, bodies get the
    values they need (see _seed_body)."""
    parameters = case.path_parameters
    if parameters:
        seeded = _SEEDS.get("parameters", {})
        for name, victim in _SEEDS.get("victims", {}).get(_label(ctx), {}).items():
            if str(parameters.get(name)) == str(seeded.get(name)):
                parameters[name] = victim
        if str(parameters.get("key_id")) == str(_SEEDS.get("own_key_id")):
            parameters["key_id"] = _fresh_key()
    operation_id = ctx.operation.definition.raw.get("operationId") if ctx.operation else None
    if operation_id in _CONSUMPTION and isinstance(case.query, dict):
        _sane_range(case.query)
    if isinstance(case.body, dict):
        operation = ctx.operation.definition.raw.get("operationId") if ctx.operation else None
        if _SEEDS.get("victims"):
            _seed_body(operation, case.body, parameters or {})
        elif operation == "createProjectEndpoint":  # sequences: the project a link created
            _own_branch(case.body.get("endpoint"), parameters or {})


_IDS = re.compile(consumption.PROJECT_IDS_PATTERN)
_CONSUMPTION = (
    "getConsumptionHistoryPerProject",
    "getConsumptionHistoryPerProjectV2",
    "getConsumptionHistoryPerBranchV2",
)
_SPAN = {"hourly": timedelta(hours=24), "daily": timedelta(days=10), "monthly": timedelta(days=90)}


def _date_time(value: Any) -> datetime | None:
    try:
        found = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo is not None else None


def _sane_range(query: dict[str, Any]) -> None:
    """A consumption range keeps rules no schema states (its ends in order, within its
    granularity's reach, in the years 2000 to 9000), which nearly every generated pair breaks;
    so a range of two valid date-times becomes one that keeps them, from the generated start.
    An organization is never found here (a 404): a valid org_id is left out. A value generated
    invalid on purpose (the negative mode) is left as it is, to be refused."""
    granularity = query.get("granularity")
    start, end = _date_time(query.get("from")), _date_time(query.get("to"))
    if isinstance(granularity, str) and granularity in _SPAN and start and end:
        if not 2000 <= start.year < 8999:
            start = datetime(2026, 1, 1, tzinfo=UTC)
        query["from"] = start.isoformat()
        query["to"] = (start + _SPAN[str(granularity)]).isoformat()
    if isinstance(query.get("org_id"), str) and len(query["org_id"]) <= 60:
        del query["org_id"]
    # Made-up ids name nothing (an empty answer); the seeded project's records are the code's.
    ids = query.get("project_ids")
    seeded = _SEEDS.get("parameters", {}).get("project_id")
    if seeded and isinstance(ids, list) and all(_IDS.fullmatch(str(i)) for i in ids):
        query["project_ids"] = [seeded]


def _valid_cu(value: Any) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0.25 <= value <= 16
        and (value * 4) % 1 == 0
    )


def _order_cu(settings: Any) -> None:
    """Compute units the platform would take: a minimum no larger than the maximum (a rule
    between two fields, which JSON Schema cannot state), the maximum raised to a lone minimum."""
    if not isinstance(settings, dict):
        return
    low, high = settings.get("autoscaling_limit_min_cu"), settings.get("autoscaling_limit_max_cu")
    if _valid_cu(low) and _valid_cu(high) and low > high:
        settings["autoscaling_limit_min_cu"], settings["autoscaling_limit_max_cu"] = high, low
    elif _valid_cu(low) and "autoscaling_limit_max_cu" not in settings:
        settings["autoscaling_limit_max_cu"] = low


def _own_branch(endpoint: Any, parameters: dict[str, Any]) -> None:
    """A new compute of a project the run made itself (a link's) goes on one of that project's
    branches, found through the API: any other id is a 404 for the branch, which schemathesis
    takes for the just-created project's (ST302)."""
    branch = endpoint.get("branch_id") if isinstance(endpoint, dict) else None
    if not (isinstance(branch, str) and 1 <= len(branch) <= 60):
        return
    r = httpx.get(
        f"{_SEEDS['base_url']}/projects/{parameters.get('project_id')}/branches",
        headers={"Authorization": f"Bearer {_SEEDS['key']}"},
        timeout=30,
    )
    branches = r.json().get("branches") if r.status_code == 200 else None
    if branches:
        endpoint["branch_id"] = branches[0]["id"]


def _seed_body(operation_id: str | None, body: dict[str, Any], parameters: dict[str, Any]) -> None:
    """Values a request needs to reach past the checks the document cannot state: a database's
    owner is a seeded role, a new compute goes on a branch without one, a compute stays on its
    branch, compute units are in order. Only a value the document allows is replaced, so a case
    meant to be invalid stays invalid."""
    database, endpoint = body.get("database"), body.get("endpoint")
    if operation_id == "createProjectBranchDatabase" and isinstance(database, dict):
        owner = database.get("owner_name")
        if isinstance(owner, str) and 1 <= len(owner) <= 63 and _ROLE.fullmatch(owner):
            database["owner_name"] = "neondb_owner"
    if operation_id in ("createProjectEndpoint", "updateProjectEndpoint") and isinstance(
        endpoint, dict
    ):
        branch = endpoint.get("branch_id")
        if isinstance(branch, str) and 1 <= len(branch) <= 60:
            seeded = str(parameters.get("project_id")) == str(
                _SEEDS.get("parameters", {}).get("project_id")
            )
            if operation_id == "createProjectEndpoint" and seeded:
                endpoint["branch_id"] = next(_BARE_BRANCHES) or branch
            elif operation_id == "createProjectEndpoint":
                _own_branch(endpoint, parameters)
            else:
                endpoint["branch_id"] = _SEEDS.get("parameters", {}).get("branch_id", branch)
        _order_cu(endpoint)
    if operation_id == "restoreProjectBranch":
        _restore_from_a_seeded_branch(body)
    if operation_id in ("updateMaskingRules", "createProjectBranchAnonymized"):
        _applicable_rules(body.get("masking_rules"))
    endpoints = body.get("endpoints")
    for each in endpoints if isinstance(endpoints, list) else []:
        _order_cu(each)
    project = body.get("project")
    if isinstance(project, dict):
        _order_cu(project)
        _order_cu(project.get("default_endpoint_settings"))


def _applicable_rules(rules: Any) -> None:
    """Masking rules the platform can apply, on the table the seed made for them: a generated
    expression (any string) becomes an offered function, a rule gives one of its two ways and
    names one of the table's three columns, once (rules the document cannot state: an
    operation started for others would fail). A value of the wrong type stays, to be refused."""
    if not isinstance(rules, list):
        return
    del rules[3:]
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            continue
        if isinstance(rule.get("masking_function"), str):
            rule["masking_function"] = "anon.fake_email()"
            rule.pop("masking_value", None)
        elif rule.get("masking_function") is None and rule.get("masking_value") is None:
            rule["masking_value"] = "masked"
        for field, value in (
            ("database_name", "neondb"),
            ("schema_name", "public"),
            ("table_name", "masked"),
            ("column_name", f"c{i}"),
        ):
            if isinstance(rule.get(field), str) and 1 <= len(rule[field].encode()) <= 63:
                rule[field] = value


def _restore_from_a_seeded_branch(body: dict[str, Any]) -> None:
    """A restore (of the victim branch) from a seeded branch at its head: a source and a point
    the document allows are replaced by ones the platform holds (any other would be a 404, or
    outside the history, on every case)."""
    source = body.get("source_branch_id")
    if isinstance(source, str) and 1 <= len(source) <= 60:
        body["source_branch_id"] = _SEEDS.get("restore_source", source)
        for point, pattern in (
            ("source_lsn", history.LSN_PATTERN),
            ("source_timestamp", history.TIME_PATTERN),
        ):
            value = body.get(point)
            if value is None or (isinstance(value, str) and re.fullmatch(pattern, value)):
                body.pop(point, None)


@schemathesis.hook
def filter_failure(
    ctx: schemathesis.HookContext, failure: Any, case: schemathesis.Case, response: Any
) -> bool:
    """Keep every failure but a 400 (or a consumption range's 406) for a reason above."""
    if failure.code != "ST202" or response.status_code not in (400, 406):
        return True
    try:
        message = str(response.json().get("message", ""))
    except ValueError:
        return True
    return not any(reason in message for reason in OUTSIDE_JSON_SCHEMA)
