"""Masking rules (core/masking.py): what is offered is read, the rest refused by name; and the
SQL the platform writes for them (compute/local/masking.py) quotes everything it is given."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgplane.compute.local.masking import render
from pgplane.core.masking import BadMasking, Call, Column, Const, checked_rules, parse

RULE = {"database_name": "neondb", "schema_name": "public", "table_name": "t"}


def test_offered_functions_literals_and_the_column_are_read() -> None:
    assert parse("anon.fake_email()", "email") == Call("anon.fake_email", ())
    assert parse(" ANON.partial( ssn ,0,'X''s', 4 ) ", "ssn") == Call(
        "anon.partial", (Column(), Const(0), Const("X's"), Const(4))
    )
    assert parse("concat(anon.dummy_uuidv4(), '@example.com')", "e") == Call(
        "pg_catalog.concat", (Call("anon.dummy_uuidv4", ()), Const("@example.com"))
    )
    assert parse('anon.hash("Email")', "Email") == Call("anon.hash", (Column(),))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("anon.pseudo_email(email)", "anon.pseudo_email is not offered"),
        ("pg_catalog.pg_read_file('/etc/passwd')", "pg_read_file is not offered"),
        ("anon.fake_email(); DROP TABLE t", "cannot read"),
        ("anon.fake_email() || 'x'", "cannot read"),
        ("other_column", "neither the rule's column"),
        ("anon.random_string()", "takes 1 arguments, not 0"),
        ("anon.partial(email, 1, 'x')", "takes 4 arguments, not 3"),
        ("anon.fake_email(", "missing"),
        ("anon.fake_email(1", "expected"),
        ("", "missing"),
        ("anon.hash(" * 20 + "email" + ")" * 20, "nested"),
    ],
)
def test_anything_else_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(BadMasking, match=why):
        parse(text, "email")


def test_rules_name_a_column_once_with_one_way_to_mask_it() -> None:
    ok = {**RULE, "column_name": "email", "masking_value": "x"}
    assert checked_rules([ok]) == [ok]
    for bad, why in [
        ({**RULE, "column_name": "email"}, "one of masking_function or masking_value"),
        ({**ok, "masking_function": "anon.fake_email()"}, "one of masking_function"),
        ({**ok, "column_name": ""}, "column_name: required"),
        ({**ok, "table_name": "t" * 64}, "at most 63 bytes"),
        ({**ok, "extra": "1"}, "extra: not a field"),
        ({**RULE, "column_name": "e", "masking_function": "anon.nope()"}, "masking_function:"),
    ]:
        with pytest.raises(BadMasking, match=why):
            checked_rules([bad])
    with pytest.raises(BadMasking, match="has a rule already"):
        checked_rules([ok, ok])


def test_the_sql_quotes_every_name_and_value() -> None:
    expr = parse("anon.partial(\"we\"\"ird\", 2, '''; DROP TABLE t; --', 1)", 'we"ird')
    text = render(expr, 'we"ird').as_string(None)
    assert '"we""ird"' in text and "'''; DROP TABLE t; --'" in text
    assert isinstance(render(parse("anon.fake_email()", "e"), "e"), sql.Composable)


def test_an_error_of_the_moment_is_retried_one_of_the_rules_is_not() -> None:
    from psycopg import OperationalError, errors

    from pgplane.compute.local.masking import _failed
    from pgplane.compute.model import MaskingFailed

    assert isinstance(_failed("m", errors.UniqueViolation("dup")), MaskingFailed)
    assert isinstance(_failed("m", errors.UndefinedColumn("no c")), MaskingFailed)
    assert isinstance(_failed("m", OperationalError('database "x" does not exist')), MaskingFailed)
    for passing in (errors.AdminShutdown("bye"), OperationalError("server closed"),
                    errors.SerializationFailure("again")):  # fmt: skip
        assert not isinstance(_failed("m", passing), MaskingFailed), passing
