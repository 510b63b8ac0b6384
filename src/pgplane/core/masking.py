"""Masking rules of anonymized branches (Neon's MaskingRule), checked, and their functions.

Neon masks with the PostgreSQL Anonymizer extension, which is not installable here; the
platform does the same static masking itself, in SQL it writes (compute/local/masking.py). A
rule's ``masking_function`` is therefore not SQL to run: it is read as an expression of the
functions below (the extension's that matter, and a few of Postgres' own to combine them, as
Neon's examples do), string and number literals, and the rule's own column; anything else is
refused by name. ``masking_value`` is a constant, set as it is.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_RULES = 1000
_MAX_IDENTIFIER = 63  # Postgres' NAMEDATALEN - 1, in bytes
_MAX_EXPRESSION = 1000
_MAX_DEPTH = 8

# name: (fewest arguments, most arguments). The rule's column may be any argument.
FUNCTIONS: dict[str, tuple[int, int]] = {
    "anon.fake_email": (0, 0),
    "anon.dummy_free_email": (0, 0),
    "anon.dummy_safe_email": (0, 0),
    "anon.fake_first_name": (0, 0),
    "anon.dummy_first_name": (0, 0),
    "anon.fake_last_name": (0, 0),
    "anon.dummy_last_name": (0, 0),
    "anon.dummy_name": (0, 0),
    "anon.fake_company": (0, 0),
    "anon.dummy_company_name": (0, 0),
    "anon.fake_city": (0, 0),
    "anon.random_phone": (0, 1),
    "anon.dummy_phone_number": (0, 0),
    "anon.random_string": (1, 1),
    "anon.random_int_between": (2, 2),
    "anon.random_zip": (0, 0),
    "anon.dummy_uuidv4": (0, 0),
    "anon.partial": (4, 4),
    "anon.partial_email": (1, 1),
    "anon.hash": (1, 1),
    "pg_catalog.concat": (1, 20),
    "pg_catalog.lower": (1, 1),
    "pg_catalog.upper": (1, 1),
    "pg_catalog.md5": (1, 1),
    "pg_catalog.left": (2, 2),
    "pg_catalog.right": (2, 2),
    "pg_catalog.gen_random_uuid": (0, 0),
}
# Postgres' own may be named without their schema, as SQL allows.
_BARE = {name.split(".", 1)[1]: name for name in FUNCTIONS if name.startswith("pg_catalog.")}


class BadMasking(ValueError):
    """A rule the platform cannot apply; the message names what to change."""


@dataclass(frozen=True, slots=True)
class Call:
    name: str  # one of FUNCTIONS
    args: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Const:
    value: str | int


@dataclass(frozen=True, slots=True)
class Column:
    """The rule's own column (its value before masking)."""


Expr = Call | Const | Column

_TOKEN = re.compile(
    r"\s*(?:(?P<string>'(?:[^']|'')*')|(?P<number>-?\d+)|(?P<name>[A-Za-z_][A-Za-z0-9_]*"
    r'|"(?:[^"]|"")+")|(?P<punct>[(),.]))'
)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        if text[at:].strip() == "":
            break
        found = _TOKEN.match(text, at)
        if found is None or found.lastgroup is None:
            raise BadMasking(f"cannot read {text[at : at + 20]!r}")
        out.append((found.lastgroup, found.group(found.lastgroup)))
        at = found.end()
    return out


def _ident(token: str) -> str:
    return token[1:-1].replace('""', '"') if token.startswith('"') else token.lower()


class _Parser:
    def __init__(self, text: str, column: str) -> None:
        self.tokens = _tokens(text)
        self.at = 0
        self.column = column

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, kind: str, value: str | None = None) -> str:
        got = self.peek()
        if got is None or got[0] != kind or (value is not None and got[1] != value):
            raise BadMasking(f"expected {value or kind} at {got[1] if got else 'the end'!r}")
        self.at += 1
        return got[1]

    def expr(self, depth: int = 0) -> Expr:
        if depth > _MAX_DEPTH:
            raise BadMasking(f"calls nested more than {_MAX_DEPTH} deep")
        got = self.peek()
        if got is None:
            raise BadMasking("an expression is missing")
        kind, value = got
        if kind == "string":
            self.at += 1
            return Const(value[1:-1].replace("''", "'"))
        if kind == "number":
            self.at += 1
            return Const(int(value))
        name = _ident(self.take("name"))
        nxt = self.peek()
        if nxt == ("punct", "."):
            self.at += 1
            name = f"{name}.{_ident(self.take('name'))}"
            nxt = self.peek()
        if nxt != ("punct", "("):
            if name == self.column:
                return Column()
            raise BadMasking(
                f"{name!r} is neither the rule's column ({self.column!r}) nor a function call"
            )
        return self.call(name, depth)

    def call(self, name: str, depth: int) -> Call:
        full = _BARE.get(name, name)
        if full not in FUNCTIONS:
            raise BadMasking(
                f"{name} is not offered here (the PostgreSQL Anonymizer extension is not; the"
                f" platform masks with its own): offered are {', '.join(sorted(FUNCTIONS))}"
            )
        self.take("punct", "(")
        args: list[Expr] = []
        if self.peek() != ("punct", ")"):
            args.append(self.expr(depth + 1))
            while self.peek() == ("punct", ","):
                self.at += 1
                args.append(self.expr(depth + 1))
        self.take("punct", ")")
        fewest, most = FUNCTIONS[full]
        if not fewest <= len(args) <= most:
            wanted = str(fewest) if fewest == most else f"{fewest} to {most}"
            raise BadMasking(f"{full} takes {wanted} arguments, not {len(args)}")
        return Call(full, tuple(args))


def parse(text: str, column: str) -> Expr:
    """The expression ``text`` as the platform applies it to ``column``; BadMasking if it is
    not one of the offered functions, literals and the column."""
    if len(text) > _MAX_EXPRESSION:
        raise BadMasking(f"longer than {_MAX_EXPRESSION} characters")
    parser = _Parser(text, column)
    found = parser.expr()
    if parser.peek() is not None:
        raise BadMasking(f"unexpected {parser.peek()[1]!r} after the expression")  # type: ignore[index]
    return found


_FIELDS = ("database_name", "schema_name", "table_name", "column_name")


def checked_rules(rules: Sequence[object]) -> list[dict[str, str]]:
    """Neon's MaskingRule objects as kept: each names its column and exactly one of
    ``masking_function`` (read by :func:`parse`) or ``masking_value``; a column once."""
    if len(rules) > MAX_RULES:
        raise BadMasking(f"at most {MAX_RULES} rules")
    out: list[dict[str, str]] = []
    seen: set[tuple[str, ...]] = set()
    for i, rule in enumerate(rules):
        kept = _checked(f"masking_rules[{i}]", rule)
        key = tuple(kept[f] for f in _FIELDS)
        if key in seen:
            raise BadMasking(f"masking_rules[{i}]: column {'.'.join(key)} has a rule already")
        seen.add(key)
        out.append(kept)
    return out


def _checked(at: str, rule: object) -> dict[str, str]:
    if not isinstance(rule, Mapping):
        raise BadMasking(f"{at}: must be an object")
    unknown = set(rule) - {*_FIELDS, "masking_function", "masking_value"}
    if unknown:
        raise BadMasking(f"{at}.{sorted(unknown)[0]}: not a field of a masking rule")
    kept: dict[str, str] = {}
    for field in _FIELDS:
        value = rule.get(field)
        if not isinstance(value, str) or not value or "\0" in value:
            raise BadMasking(f"{at}.{field}: required, a name")
        if len(value.encode()) > _MAX_IDENTIFIER:
            raise BadMasking(f"{at}.{field}: at most {_MAX_IDENTIFIER} bytes")
        kept[field] = value
    function, value = rule.get("masking_function"), rule.get("masking_value")
    if (function is None) == (value is None):
        raise BadMasking(f"{at}: give one of masking_function or masking_value")
    if function is not None:
        if not isinstance(function, str):
            raise BadMasking(f"{at}.masking_function: must be a string")
        try:
            parse(function, kept["column_name"])
        except BadMasking as exc:
            raise BadMasking(f"{at}.masking_function: {exc}") from None
        kept["masking_function"] = function
    else:
        if not isinstance(value, str) or "\0" in value:
            raise BadMasking(f"{at}.masking_value: must be a string")
        kept["masking_value"] = value
    return kept
