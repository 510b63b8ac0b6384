"""``pgplane serve`` killed inside an anonymized branch's masking (its masks committed, the end
not yet recorded, on a temporary postmaster no client reaches): the restarted server's retry
masks again, the branch ends anonymized once, every row masked, the parent untouched, and no
compute of it ran before.
"""

from __future__ import annotations

import psycopg
import pytest

from tests.crash import ROWS, SUM, Crash, assert_consistent, slow

RULE = {
    "database_name": "neondb",
    "schema_name": "public",
    "table_name": "t",
    "column_name": "v",
    "masking_function": "anon.random_int_between(-100, -1)",
}


@pytest.mark.parametrize("failpoint", ["anonymize:database_masked", slow("after:anonymize")])
def test_kill_inside_a_masking(crash: Crash, failpoint: str) -> None:
    crash.arm(failpoint)
    r = crash.api.http.post(
        f"/projects/{crash.pid}/branch_anonymized",
        json={
            "branch_create": {"endpoints": [{"type": "read_write"}]},
            "masking_rules": [RULE],
            "start_anonymization": True,
        },
    )
    assert r.status_code == 201, r.text
    body = r.json()
    crash.kill_at(failpoint)
    crash.settle([o["id"] for o in body["operations"]])
    assert_consistent(crash.server, crash.api, crash.pid)

    where = f"/projects/{crash.pid}/branches/{body['branch']['id']}"
    status = crash.api.http.get(f"{where}/anonymized_status").json()
    assert status["state"] == "anonymized" and status["last_run"]["masked_columns"] == 1, status
    with psycopg.connect(body["connection_uris"][0]["connection_uri"], connect_timeout=60) as c:
        row = c.execute("SELECT count(*), max(v), min(v) FROM t").fetchone()
    assert row is not None and row[0] == ROWS and -100 <= row[2] <= row[1] <= -1, row
    assert crash.rows() == (ROWS, SUM)  # the parent untouched
