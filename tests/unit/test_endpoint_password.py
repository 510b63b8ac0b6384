"""Neon's ``endpoint=<id>;<password>`` forms, parsed as Neon's proxy takes them."""

from __future__ import annotations

import pytest

from pgplane.proxy.endpoint_password import parse


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (b"endpoint=ep-cool-1;secret", ("ep-cool-1", "secret")),
        (b"project=ep-cool-1;secret", ("ep-cool-1", "secret")),
        (b"endpoint=ep-cool-1$secret", ("ep-cool-1", "secret")),
        # The id holds neither separator: the first one ends it, the password keeps the other.
        (b"endpoint=ep-cool-1;se$c;ret", ("ep-cool-1", "se$c;ret")),
        (b"endpoint=ep-cool-1$se;cret", ("ep-cool-1", "se;cret")),
        (b"endpoint=EP-Cool-1-pooler;s", ("ep-cool-1", "s")),
        (b"endpoint=ep-cool-1;", ("ep-cool-1", "")),
        ("endpoint=ep-x;pässwörd".encode(), ("ep-x", "pässwörd")),
    ],
)
def test_the_forms_neon_takes(given: bytes, expected: tuple[str, str]) -> None:
    assert parse(given) == expected


@pytest.mark.parametrize(
    "given",
    [
        b"secret",
        b"endpoint=ep-cool-1",  # no separator
        b"endpoint=;secret",
        b"endpoint=ep cool;secret",
        b"Endpoint=ep-cool-1;secret",
        b" endpoint=ep-cool-1;secret",
        b"endpoint=" + b"e" * 64 + b";secret",
        b"endpoint=ep-x;\xff\xfe",  # not UTF-8
    ],
)
def test_anything_else_is_not_the_form(given: bytes) -> None:
    assert parse(given) is None
