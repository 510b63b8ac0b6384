"""Anonymized branches (Neon's ``branch_anonymized``), made with create-branch-action's arguments:
every row's masked columns changed, the others identical, the parent untouched; nothing of the
branch served before its masking; its restricted actions refused; the tenant's code never run
with the platform's rights while masking.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support import Api, Server, running_server

ROWS = 60
RULES = [
    {"masking_function": "anon.fake_email()", "column_name": "email"},
    {"masking_function": "anon.fake_first_name()", "column_name": "name"},
    {"masking_function": "anon.random_phone('+1-')", "column_name": "phone"},
    {"masking_function": "anon.partial(ssn, 0, 'XXX-XX-', 4)", "column_name": "ssn"},
    {"masking_value": "redacted", "column_name": "note"},
    {"masking_function": "pg_catalog.concat(anon.dummy_uuidv4(), '@example.com')",
     "column_name": "backup_email"},
]  # fmt: skip
WHERE = {"database_name": "neondb", "schema_name": "public", "table_name": "users"}


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    """A server of this module's own: a masking that fails for good (as one test asks) is a
    failed operation, which the shared server's end-of-session check refuses."""
    with running_server() as srv:
        yield srv


def _rules(*rules: dict[str, str]) -> list[dict[str, str]]:
    return [{**WHERE, **r} for r in rules]


def _users(uri: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(uri, connect_timeout=30) as conn:
        return conn.execute(
            "SELECT id, email, name, phone, ssn, note, backup_email, kept, who FROM users"
            " ORDER BY id"
        ).fetchall()


@pytest.fixture
def project(api: Api) -> dict[str, Any]:
    body = api.create_ready_project(name="anonymized")
    with psycopg.connect(body["connection_uris"][0]["connection_uri"], autocommit=True) as c:
        # who: a generated column calling the tenant's function, recomputed by the masking's
        # UPDATE: it records the role that ran it (never the platform's superuser).
        c.execute("CREATE FUNCTION whoami(t text) RETURNS text IMMUTABLE LANGUAGE sql"
                  " AS $$ SELECT current_user::text $$")  # fmt: skip
        c.execute(
            "CREATE TABLE users (id int PRIMARY KEY, email text UNIQUE, name text, phone text,"
            " ssn text, note text, backup_email text, kept text,"
            " who text GENERATED ALWAYS AS (whoami(email)) STORED)"
        )
        c.execute(
            "INSERT INTO users (id, email, name, phone, ssn, note, backup_email, kept)"
            " SELECT g, 'person' || g || '@corp.test', 'Person' || g, '555-01' || g,"
            " '123-45-' || lpad(g::text, 4, '0'), 'secret ' || g, 'b' || g || '@corp.test',"
            " 'kept ' || g FROM generate_series(1, %s) g",
            (ROWS,),
        )
    return body


def test_an_anonymized_branch_from_create_branch_action_s_arguments(
    api: Api, project: dict[str, Any]
) -> None:
    pid, main = project["project"]["id"], project["branch"]["id"]
    main_uri = project["connection_uris"][0]["connection_uri"]
    before = _users(main_uri)
    r = api.http.post(
        f"/projects/{pid}/branch_anonymized",
        json={
            "branch_create": {
                "branch": {"name": "preview/pr-7", "parent_id": main},
                "endpoints": [{"type": "read_write"}],
            },
            "masking_rules": _rules(*RULES),
            "start_anonymization": True,
            "annotation_value": {"github-pr-number": "7"},
        },
    )
    body = api.settled(pid, r)
    assert r.status_code == 201
    branch = body["branch"]
    assert [o["action"] for o in body["operations"]] == [
        "create_branch", "apply_config", "start_compute"
    ]  # fmt: skip
    assert {a["name"] for a in branch["restricted_actions"]} == {"restore", "delete-rw-endpoint"}
    where = f"/projects/{pid}/branches/{branch['id']}"
    status = api.http.get(f"{where}/anonymized_status").json()
    assert status["state"] == "anonymized", status
    assert status["last_run"]["masked_columns"] == len(RULES)
    assert api.http.get(f"{where}/masking_rules").json()["masking_rules"] == _rules(*RULES)

    after = _users(body["connection_uris"][0]["connection_uri"])
    assert len(after) == ROWS and _users(main_uri) == before  # the parent untouched
    originals = {column: {row[column] for row in before} for column in range(9)}
    for old, new in zip(before, after, strict=True):
        assert new[0] == old[0] and new[7] == old[7]  # id and the unmasked column, identical
        assert new[1] not in originals[1] and new[1].endswith("@example.com")
        assert new[2] not in originals[2] and new[2].istitle()
        assert new[3].startswith("+1-") and new[3] not in originals[3]
        assert new[4] == "XXX-XX-" + old[4][-4:]
        assert new[5] == "redacted"
        assert new[6] not in originals[6] and new[6].endswith("@example.com")
        assert new[8] == "neondb_owner"  # the tenant's function ran as the tenant
    assert len({row[1] for row in after}) == ROWS  # still unique

    # What it shows it cannot do, it cannot.
    r = api.http.post(f"{where}/restore", json={"source_branch_id": main})
    assert r.status_code == 409 and "anonymized" in r.json()["message"], r.text
    endpoint = body["endpoints"][0]["id"]
    r = api.http.delete(f"/projects/{pid}/endpoints/{endpoint}")
    assert r.status_code == 409 and "read-write compute" in r.json()["message"], r.text
    # Its past holds its parent's rows: never a source.
    point = {"parent_id": branch["id"], "parent_timestamp": branch["created_at"]}
    r = api.http.post(f"/projects/{pid}/branches", json={"branch": point})
    assert r.status_code == 400 and "history before the masking" in r.json()["message"], r.text
    r = api.http.post(f"{where}/snapshot", params={"timestamp": branch["created_at"]})
    assert r.status_code == 400 and "anonymized" in r.json()["message"], r.text


def test_nothing_serves_before_the_masking_and_bad_rules_are_refused(
    api: Api, project: dict[str, Any]
) -> None:
    pid = project["project"]["id"]
    r = api.http.post(
        f"/projects/{pid}/branch_anonymized",
        json={"masking_rules": [{**WHERE, "column_name": "x"}]},
    )
    assert r.status_code == 400 and "masking_function or masking_value" in r.json()["message"]
    unknown = _rules({"masking_function": "anon.pseudo_email(email)", "column_name": "email"})
    r = api.http.post(f"/projects/{pid}/branch_anonymized", json={"masking_rules": unknown})
    assert r.status_code == 400 and "anon.pseudo_email is not offered" in r.json()["message"]
    sneaky = _rules(
        {"masking_function": "anon.fake_email(); drop table users", "column_name": "email"}
    )
    r = api.http.post(f"/projects/{pid}/branch_anonymized", json={"masking_rules": sneaky})
    assert r.status_code == 400, r.text

    r = api.http.post(
        f"/projects/{pid}/branch_anonymized",
        json={"branch_create": {"endpoints": [{"type": "read_write"}]},
              "masking_rules": _rules({"masking_value": "x", "column_name": "email"})},
    )  # fmt: skip
    body = api.settled(pid, r)
    where = f"/projects/{pid}/branches/{body['branch']['id']}"
    assert api.http.get(f"{where}/anonymized_status").json()["state"] == "initialized"
    assert body["endpoints"][0]["current_state"] == "idle"
    uri = body["connection_uris"][0]["connection_uri"]
    with pytest.raises(psycopg.OperationalError, match="masking has not completed"):
        psycopg.connect(uri, connect_timeout=30).close()

    # Rules replaced, then the masking: now it serves, masked.
    rules = _rules({"masking_function": "anon.hash(email)", "column_name": "email"})
    r = api.http.patch(f"{where}/masking_rules", json={"masking_rules": rules})
    assert r.status_code == 200 and r.json()["masking_rules"] == rules, r.text
    r = api.http.post(f"{where}/anonymize")
    assert r.status_code == 200 and r.json()["state"] == "anonymizing", r.text
    api.wait_operations(pid, [o["id"] for o in api.operations(pid) if o["status"] != "finished"])
    assert api.http.get(f"{where}/anonymized_status").json()["state"] == "anonymized"
    emails = [row[1] for row in _users(uri)]
    assert all(len(e) == 64 and "@" not in e for e in emails), emails[:3]

    # A trigger that would fire even during the masking: the masking fails, saying why.
    with psycopg.connect(uri, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION keep() RETURNS trigger LANGUAGE plpgsql"
                     " AS $$ BEGIN NEW.email := OLD.email; RETURN NEW; END $$")  # fmt: skip
        conn.execute(
            "CREATE TRIGGER keep BEFORE UPDATE ON users FOR EACH ROW EXECUTE FUNCTION keep()"
        )
        conn.execute("ALTER TABLE users ENABLE ALWAYS TRIGGER keep")
    r = api.http.post(f"{where}/anonymize")
    assert r.status_code == 200, r.text
    api.wait_operations(pid, [o["id"] for o in api.operations(pid) if o["status"] != "finished"])
    status = api.http.get(f"{where}/anonymized_status").json()
    assert status["state"] == "error" and "keep" in status["status_message"], status
    r = api.http.get(f"/projects/{pid}/branches/{project['branch']['id']}/anonymized_status")
    assert r.status_code == 404, r.text
