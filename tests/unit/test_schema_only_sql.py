"""The SQL a schema-only branch's build writes from what it read (pure, no Postgres)."""

from __future__ import annotations

import pytest

from pgplane.compute.driver import RestoreFailed
from pgplane.compute.local.schemaonly import source, target
from pgplane.compute.local.schemaonly.source import Membership, RoleDef, Setting


def _text(composed: object) -> str:
    return composed.as_string(None)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("stored", "items"),
    [
        ("app, public", ["app", "public"]),
        ('"$user", public', ["$user", "public"]),
        ('"a, ""b""", c', ['a, "b"', "c"]),
        ("", []),
    ],
)
def test_a_stored_list_splits_as_postgres_splits_it(stored: str, items: list[str]) -> None:
    assert target._split_list(stored) == items


def test_settings_are_literals_and_names_identifiers() -> None:
    listed = Setting(role="r; DROP", database=None, name="search_path", value='app, "x y"')
    assert _text(target._alter_set(listed)) == (
        "ALTER ROLE \"r; DROP\" SET \"search_path\" TO 'app', 'x y'"
    )
    plain = Setting(role=None, database="db", name="statement_timeout", value="30s")
    assert _text(target._alter_set(plain)) == (
        'ALTER DATABASE "db" SET "statement_timeout" TO \'30s\''
    )


def test_a_role_is_made_with_what_a_tenant_role_can_hold() -> None:
    role = RoleDef(
        name='x"y',
        verifier="SCRAM-SHA-256$4096:a$b:c",
        login=True,
        inherit=True,
        createrole=False,
        createdb=True,
        connection_limit=-1,
        valid_until=None,
    )
    assert _text(target._create_role(role)) == (
        'CREATE ROLE "x""y" LOGIN INHERIT NOCREATEROLE CREATEDB CONNECTION LIMIT  -1'
        " PASSWORD 'SCRAM-SHA-256$4096:a$b:c'"
    )


def test_superusers_and_platform_memberships_are_refused() -> None:
    row = ("boss", None, True, True, True, True, -1, None, True, False, False)
    with pytest.raises(RestoreFailed, match="superuser"):
        source._role(row)
    with pytest.raises(RestoreFailed, match="pg_read_server_files"):
        source._memberships([("pg_read_server_files", "app", None, False, None, None)], {"app"})
    # The platform's own memberships are not the tenant's: left out.
    assert (
        source._memberships([("pg_monitor", "pgplane_monitor", None, False, None, None)], {"app"})
        == []
    )


def test_a_membership_keeps_its_options_and_grantor() -> None:
    m = Membership(role="r", member="m", grantor="g", admin=True, inherit=False, set=True)
    assert _text(target._membership(m, 170000)) == (
        'GRANT "r" TO "m" WITH ADMIN True, INHERIT False, SET True GRANTED BY "g"'
    )
    assert (
        _text(target._membership(m, 150000)) == 'GRANT "r" TO "m" WITH ADMIN OPTION GRANTED BY "g"'
    )
