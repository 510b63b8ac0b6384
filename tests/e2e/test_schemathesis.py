"""Scenario B1: schemathesis against the platform's own OpenAPI document, served by a real server.

Every documented operation gets examples, boundary cases (the coverage phase), fuzzed cases and
sequences that follow the ids one response gives the next (the stateful phase, ``-m slow``), in
positive and negative modes; every response goes through all of schemathesis' checks: no server
error, status, content type, headers and body as documented, schema-valid requests taken and
invalid ones refused, authentication enforced, unknown methods 405 with ``Allow``, OPTIONS telling
the truth, a deleted object gone and a created one there. Path parameters are the ids of a seeded
project, so requests reach the code behind the lookups; each destructive operation gets an object
of its own.

schemathesis runs as its command line (the same engine as its pytest plugin, whose fixture loader
does not work with pytest 9.2), seeded and bounded so CI stays quick: ``PGPLANE_FUZZ_EXAMPLES``
raises the number of cases per operation for a longer run (150 takes about seven minutes), and
``-m slow`` runs four times CI's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.conftest import assert_operations_settled
from tests.support import Api, Server, path_parameters, running_server

ROOT = Path(__file__).resolve().parents[2]
SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
SEED = 20261121
# Ten cases per operation in CI (each operation's coverage phase comes on top); the slow
# variant below runs four times as many, before a change to the API lands.
EXAMPLES = int(os.environ.get("PGPLANE_FUZZ_EXAMPLES", "10"))


@pytest.fixture(scope="module")
def fuzzed() -> Iterator[Server]:
    """A server of the fuzzer's own, which it creates, changes and deletes on at will; its
    computes take ports of their own range."""
    # The account quotas are off: the fuzzer creates projects and computes as fast as it likes, in
    # one account, and each quota's refusals are tested on their own (tests/e2e/test_quotas.py).
    with running_server(
        PGPLANE_COMPUTE_PORTS="22100-22499",
        PGPLANE_PROJECTS_PER_ACCOUNT="0",
        PGPLANE_RUNNING_COMPUTES_PER_ACCOUNT="0",
        PGPLANE_COMPUTE_UNITS_PER_ACCOUNT="0",
    ) as srv:
        yield srv
        # Whatever the runs started settles, and nothing they were allowed to start failed.
        assert_operations_settled(srv, timeout=300)


@pytest.fixture(scope="module")
def seeds(fuzzed: Server) -> dict[str, Any]:
    return seed(fuzzed)


def seed(fuzzed: Server) -> dict[str, Any]:
    """Ids for path parameters: a project with a compute, role and database; and for each
    destructive operation a victim of its own, so the seeded objects outlive the run."""
    key_id, key = fuzzed.create_key("fuzz@example.com")
    with Api(fuzzed, key) as api:
        # The compute never suspends on its own: every change to it is the run's.
        never = {"default_endpoint_settings": {"suspend_timeout_seconds": -1}}
        project = api.create_ready_project(name="fuzzed", **never)
        pid, bid = project["project"]["id"], project["branch"]["id"]
        branch = f"/projects/{pid}/branches/{bid}"
        doomed = api.create_ready_project(name="doomed")
        doomed_branch = api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))
        # Restored again and again from a branch without a compute (a plain copy of its data):
        # from the seeded branch, whose compute runs, each would be an online copy.
        reset_branch = api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))
        restore_source = api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))
        with_compute = api.settled(
            pid,
            api.http.post(
                f"/projects/{pid}/branches",
                json={"branch": {"name": "with-compute"}, "endpoints": [{"type": "read_write"}]},
            ),
        )
        api.settled(pid, api.http.post(f"{branch}/roles", json={"role": {"name": "doomed"}}))
        for name in ("doomed_db", "renamed_db"):
            api.settled(
                pid,
                api.http.post(
                    f"{branch}/databases",
                    json={"database": {"name": name, "owner_name": "neondb_owner"}},
                ),
            )
        doomed_key = api.http.post("/api_keys", json={"key_name": "doomed"}).json()["id"]
        # Snapshots of a branch without a compute (a restore with finalize_restore restores it):
        # one renamed and restored again and again, one deleted.
        source = restore_source["branch"]["id"]
        snap, doomed_snap = (
            api.settled(pid, api.http.post(f"/projects/{pid}/branches/{source}/snapshot"))[
                "snapshot"
            ]["id"]
            for _ in range(2)
        )
        # A branch the snapshot was restored into, left to be finalized: the run finalizes it
        # (it replaces the snapshot's source, whose name it takes).
        candidate = api.settled(
            pid, api.http.post(f"/projects/{pid}/snapshots/{snap}/restore", json={})
        )["branch"]["id"]
        # An anonymized branch for its routes (rules the run replaces, maskings it starts), of
        # the seeded branch's table the rules are steered to (schemathesis_hooks.py).
        uri = project["connection_uris"][0]["connection_uri"]
        with psycopg.connect(uri, autocommit=True, connect_timeout=30) as conn:
            conn.execute("CREATE TABLE masked AS SELECT 'a' AS c0, 'b' AS c1, 'c' AS c2")
        # Two: one the run masks (a masking queued behind the run's copies keeps its rules
        # unchangeable, a 409, for as long), one whose rules it replaces.
        anonymized, masked = (
            api.settled(
                pid, api.http.post(f"/projects/{pid}/branch_anonymized", json={"masking_rules": []})
            )["branch"]["id"]
            for _ in range(2)
        )
        # Branches without a compute, for the endpoints the run creates.
        bare = [
            api.settled(pid, api.http.post(f"/projects/{pid}/branches", json={}))["branch"]["id"]
            for _ in range(3)
        ]
    base = "/api/v2/projects/{project_id}"
    return {
        "base_url": fuzzed.base_url,
        "key": key,
        "own_key_id": key_id,
        "bare_branches": bare,
        "restore_source": restore_source["branch"]["id"],
        # The key id is never the key the run authenticates with.
        # And for the schema routes' query: the seeded database, compared with its own branch.
        "parameters": {
            **path_parameters(project, key_id=doomed_key, snapshot_id=snap),
            "db_name": "neondb",
            "base_branch_id": bid,
        },
        "victims": {
            f"DELETE {base}": {"project_id": doomed["project"]["id"]},
            f"DELETE {base}/branches/{{branch_id}}": {"branch_id": doomed_branch["branch"]["id"]},
            f"DELETE {base}/endpoints/{{endpoint_id}}": {
                "endpoint_id": with_compute["endpoints"][0]["id"]
            },
            f"DELETE {base}/branches/{{branch_id}}/roles/{{role_name}}": {"role_name": "doomed"},
            f"DELETE {base}/branches/{{branch_id}}/databases/{{database_name}}": {
                "database_name": "doomed_db"
            },
            f"PATCH {base}/branches/{{branch_id}}/databases/{{database_name}}": {
                "database_name": "renamed_db"
            },
            f"DELETE {base}/snapshots/{{snapshot_id}}": {"snapshot_id": doomed_snap},
            f"POST {base}/branches/{{branch_id}}/finalize_restore": {"branch_id": candidate},
            f"POST {base}/branches/{{branch_id}}/restore": {
                "branch_id": reset_branch["branch"]["id"]
            },
            **{
                f"{route}/branches/{{branch_id}}/{tail}": {"branch_id": anonymized}
                for route, tail in (
                    (f"GET {base}", "anonymized_status"),
                    (f"GET {base}", "masking_rules"),
                    (f"PATCH {base}", "masking_rules"),
                )
            },
            f"POST {base}/branches/{{branch_id}}/anonymize": {"branch_id": masked},
        },
    }


def _toml(value: Any) -> str:
    return json.dumps(value)  # a JSON string, number or list is a TOML one too


def _config(server: Server, seeds: dict[str, Any], max_examples: int, stateful: bool) -> str:
    """The run's configuration: every check; for the per-operation phases, the seeded ids, and
    warnings are failures."""
    common = f"""
seed = {SEED}
hooks = "tests.e2e.schemathesis_hooks"
base-url = {_toml(server.base_url.removesuffix("/api/v2"))}
request-timeout = 60
workers = 1

[headers]
Authorization = {_toml("Bearer " + seeds["key"])}

[generation]
mode = "all"
max-examples = {max_examples}
deterministic = true
database = "none"

[cache]
enabled = false

[checks]
enabled = true
"""
    if stateful:
        # Sequences find their ids in the responses before them: nothing seeded.
        return (
            common
            + """
[phases]
examples.enabled = false
coverage.enabled = false
fuzzing.enabled = false
stateful.enabled = true
"""
        )
    parameters = "\n".join(f"{k} = {_toml(v)}" for k, v in seeds["parameters"].items())
    return (
        common
        + f"""
[phases]
stateful.enabled = false

[parameters]
{parameters}
"""
    )


def run(
    server: Server, seeds: dict[str, Any], tmp: Path, max_examples: int, *, stateful: bool = False
) -> dict[str, Any]:
    """One schemathesis run over every operation; its JSON report, with its output."""
    config = tmp / "schemathesis.toml"
    config.write_text(_config(server, seeds, max_examples, stateful))
    report = tmp / "report.json"
    # Victims stand in for seeded ids only: in sequences every id comes from a response.
    hooks_see = {k: v for k, v in seeds.items() if not (stateful and k == "victims")}
    env = {**os.environ, "PGPLANE_FUZZ_SEEDS": json.dumps(hooks_see), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            SCHEMATHESIS,
            "--config-file",
            str(config),
            "run",
            f"{server.base_url}/openapi.json",
            "--checks",
            "all",
            # "all" brings the response-time check along, at 10 s by default: how long a
            # response takes is the machine's load, not the document's (a schema dump took 12 s
            # on a loaded one), so its limit is the request timeout, past which nothing answers.
            "--max-response-time",
            "60",
            "--report",
            "json",
            "--report-json-path",
            str(report),
            "--no-color",
        ],
        capture_output=True,
        text=True,
        cwd=tmp,
        env=env,
        timeout=1800,
        check=False,
    )
    result: dict[str, Any] = json.loads(report.read_text())
    result["output"] = done.stdout[-20000:] + done.stderr[-5000:]
    result["returncode"] = done.returncode
    return result


def _assert_clean(result: dict[str, Any], *, warnings: bool = True) -> None:
    output = result["output"]
    assert result["complete"], output
    assert result["failures"] == [], output
    assert result["errors"] == [], output
    assert result["returncode"] == 0, output
    if warnings:
        assert result["operations"]["tested"] == result["operations"]["total"], output
        # No warning: in particular no operation answered only 401s, or only 404s (the seeded
        # ids reached the code behind them). A deletion is the exception to the second: it
        # deletes its victim once, and every case after that is rightly a 404.
        found = {k: set(v) for k, v in result["warnings"].items() if v}
        found["missing_test_data"] = {
            label
            for label in found.get("missing_test_data", set())
            if not label.startswith("DELETE ")
        }
        # A branch takes one read_write compute: the run's creations past the seeded branches
        # without one are conflicts (409), which schemathesis counts as rejected data.
        # And a restore is finalized once: every case after the first is a conflict too.
        found["validation_mismatch"] = found.get("validation_mismatch", set()) - {
            "POST /api/v2/projects/{project_id}/endpoints",
            "POST /api/v2/projects/{project_id}/branches/{branch_id}/finalize_restore",
        }
        assert {k: v for k, v in found.items() if v} == {}, output


def test_every_operation_keeps_to_the_document(
    fuzzed: Server, seeds: dict[str, Any], tmp_path: Path
) -> None:
    _assert_clean(run(fuzzed, seeds, tmp_path, max_examples=EXAMPLES))
    with Api(fuzzed, seeds["key"]) as api:  # the seeded project served the whole run
        assert api.http.get(f"/projects/{seeds['parameters']['project_id']}").status_code == 200


@pytest.mark.slow
def test_every_operation_keeps_to_the_document_at_length(
    fuzzed: Server, seeds: dict[str, Any], tmp_path: Path
) -> None:
    _assert_clean(run(fuzzed, seeds, tmp_path, max_examples=EXAMPLES * 4))


# Two minutes of sequences: run before a change to the API lands, with -m slow (the per-operation
# run above checks every operation in CI).
@pytest.mark.slow
def test_sequences_keep_to_the_document(
    fuzzed: Server, seeds: dict[str, Any], tmp_path: Path
) -> None:
    """The stateful phase: what one response creates, the next requests read, change and delete
    (use_after_free and ensure_resource_availability check those)."""
    result = run(fuzzed, seeds, tmp_path, max_examples=EXAMPLES * 3, stateful=True)
    _assert_clean(result, warnings=False)
    assert result["phases"]["stateful"]["status"] == "success", result["output"]
