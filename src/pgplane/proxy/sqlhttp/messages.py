"""The extended query protocol as SQL over HTTP speaks it to a compute: pure functions over bytes.

A query is sent as Parse (the unnamed statement, no parameter types: the server infers them),
Bind (every parameter as text, NULL as length -1; every result column as text), Describe (the
portal, for its RowDescription), Execute (all rows); a Sync ends the request's messages.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from pgplane.proxy.framing import frame


class MalformedMessage(Exception):
    """The compute sent a message that does not parse: the connection is not to be trusted."""


@dataclass(frozen=True, slots=True)
class Field:
    """One column of a RowDescription, named as the driver's ``fields`` name them."""

    name: str
    table_id: int
    column_id: int
    type_id: int
    type_size: int
    type_modifier: int


def query(text: str, params: tuple[str | None, ...]) -> bytes:
    """Parse, Bind, Describe and Execute of one query on the unnamed statement and portal."""
    parse = frame(b"P", b"\0" + text.encode() + b"\0" + struct.pack("!h", 0))
    values = [struct.pack("!hH", 0, len(params))]
    for value in params:
        if value is None:
            values.append(struct.pack("!i", -1))
        else:
            data = value.encode()
            values.append(struct.pack("!i", len(data)) + data)
    # Results as text: one format code (0) for every column.
    bind = frame(b"B", b"\0\0" + b"".join(values) + struct.pack("!hh", 1, 0))
    return parse + bind + DESCRIBE_PORTAL + EXECUTE


def statement(text: str) -> bytes:
    """A statement of the proxy's own (BEGIN, COMMIT): no parameters, no rows to describe."""
    parse = frame(b"P", b"\0" + text.encode() + b"\0" + struct.pack("!h", 0))
    bind = frame(b"B", b"\0\0" + struct.pack("!hhh", 0, 0, 0))
    return parse + bind + EXECUTE


def simple_query(text: str) -> bytes:
    return frame(b"Q", text.encode() + b"\0")


DESCRIBE_PORTAL = frame(b"D", b"P\0")
EXECUTE = frame(b"E", b"\0" + struct.pack("!i", 0))
SYNC = frame(b"S", b"")
TERMINATE = frame(b"X", b"")


def copy_fail(message: str) -> bytes:
    return frame(b"f", message.encode() + b"\0")


def row_description(payload: bytes) -> list[Field]:
    try:
        (count,) = struct.unpack_from("!h", payload)
        fields, at = [], 2
        for _ in range(count):
            end = payload.index(b"\0", at)
            name = payload[at:end].decode(errors="replace")
            table, column, type_id, size, modifier, _fmt = struct.unpack_from(
                "!IhIhih", payload, end + 1
            )
            at = end + 19
            fields.append(Field(name, table, column, type_id, size, modifier))
    except (struct.error, ValueError):
        raise MalformedMessage("malformed RowDescription") from None
    return fields


def data_row(payload: bytes) -> list[bytes | None]:
    try:
        (count,) = struct.unpack_from("!h", payload)
        values: list[bytes | None] = []
        at = 2
        for _ in range(count):
            (length,) = struct.unpack_from("!i", payload, at)
            at += 4
            if length < 0:
                values.append(None)
            else:
                values.append(payload[at : at + length])
                at += length
    except struct.error:
        raise MalformedMessage("malformed DataRow") from None
    if at != len(payload):
        raise MalformedMessage("malformed DataRow")
    return values


def command_tag(payload: bytes) -> tuple[str, int | None]:
    """CommandComplete's tag as the driver's ``command`` and ``rowCount``: ``INSERT 0 5`` is
    INSERT and 5; a tag without a count has none."""
    tag = payload.rstrip(b"\0").decode(errors="replace")
    name, _, rest = tag.partition(" ")
    if name == "INSERT":
        rest = rest.partition(" ")[2]
    return name, int(rest) if rest.isdigit() else None


def login_reply(reply: bytes) -> tuple[tuple[int, bytes] | None, bytes | None]:
    """From a compute's replies to a login (AuthenticationOk to ReadyForQuery, or its refusal):
    the cancel key (BackendKeyData), and the ErrorResponse's payload if it refused."""
    at, key = 0, None
    while at + 5 <= len(reply):
        kind = reply[at : at + 1]
        (length,) = struct.unpack_from("!I", reply, at + 1)
        if kind == b"K" and length >= 8:
            (pid,) = struct.unpack_from("!I", reply, at + 5)
            key = pid, reply[at + 9 : at + 1 + length]
        elif kind == b"E":
            return key, reply[at + 5 : at + 1 + length]
        at += 1 + length
    return key, None
