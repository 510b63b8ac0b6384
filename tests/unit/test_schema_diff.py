"""The schema diff's text: what pg_dump brackets its output with for psql is no schema."""

from __future__ import annotations

from typing import Any

from pgplane.services import schemas


class _Branch:
    def __init__(self, branch_id: str) -> None:
        self.id = branch_id


def _dump(key: str, *tables: str) -> str:
    body = "".join(f"CREATE TABLE public.{t} (id integer);\n" for t in tables)
    return f"\\restrict {key}\n\nSET statement_timeout = 0;\n{body}\n\\unrestrict {key}\n"


def _diff(before: str, after: str) -> str:
    base: Any = _Branch("br-base")
    branch: Any = _Branch("br-child")
    return schemas.diff(before, after, db_name="neondb", base=base, branch=branch)


def test_the_restrict_lines_are_no_part_of_a_diff() -> None:
    changed = _diff(_dump("aaaa1111", "t"), _dump("bbbb2222", "t", "u"))
    assert "+CREATE TABLE public.u (id integer);" in changed
    assert "restrict" not in changed, changed
    # The same schema, under two keys: no difference at all.
    assert _diff(_dump("aaaa1111", "t"), _dump("bbbb2222", "t")) == ""
