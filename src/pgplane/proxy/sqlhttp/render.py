"""The JSON SQL over HTTP answers with, exactly as Neon's serverless driver parses it.

A result is ``{"command", "rowCount", "rows", "fields", "rowAsArray"}``: rows are arrays of text
(or null), or objects keyed by field name when array mode is off. With
``Neon-Raw-Text-Output: true`` (what the driver sends) every value is the text Postgres sent and
the driver parses it by ``dataTypeID``; without it, as Neon's proxy does, booleans, small
integers, floats, JSON and arrays of them become JSON values (``int8`` and ``numeric`` stay text:
a JavaScript number would lose digits). Rows are rendered as they arrive, so what a result holds
in memory is about the size of its answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence

from pgplane.proxy.sqlhttp.messages import Field

# ErrorResponse fields by tag, under the names the driver copies onto its error.
_ERROR_FIELDS = {
    "C": "code",
    "D": "detail",
    "H": "hint",
    "P": "position",
    "p": "internalPosition",
    "q": "internalQuery",
    "W": "where",
    "s": "schema",
    "t": "table",
    "c": "column",
    "d": "dataType",
    "n": "constraint",
    "F": "file",
    "L": "line",
    "R": "routine",
}

Convert = Callable[[str], str]  # a value's text to its JSON


def error_fields(fields: dict[str, str]) -> dict[str, str]:
    """An ErrorResponse's fields (by tag) as the error JSON names them; ``message`` aside."""
    out = {name: fields[tag] for tag, name in _ERROR_FIELDS.items() if tag in fields}
    # V is the severity never translated (Postgres 9.6+); S may be in the server's language.
    severity = fields.get("V") or fields.get("S")
    if severity:
        out["severity"] = severity
    return out


def error_body(message: str, fields: dict[str, str]) -> bytes:
    return json.dumps({"message": message, **fields}, ensure_ascii=False).encode()


def fields_json(fields: Sequence[Field]) -> str:
    return json.dumps(
        [
            {
                "name": f.name,
                "dataTypeID": f.type_id,
                "tableID": f.table_id,
                "columnID": f.column_id,
                "dataTypeSize": f.type_size,
                "dataTypeModifier": f.type_modifier,
                "format": "text",
            }
            for f in fields
        ],
        ensure_ascii=False,
    )


def result_json(
    command: str, row_count: int | None, fields: str, rows: Sequence[str], array_mode: bool
) -> str:
    head = json.dumps({"command": command, "rowCount": row_count}, ensure_ascii=False)
    return (
        f'{head[:-1]},"rows":[{",".join(rows)}],"fields":{fields},'
        f'"rowAsArray":{"true" if array_mode else "false"}}}'
    )


class RowWriter:
    """Renders a result's rows to JSON text, one at a time."""

    def __init__(self, fields: Sequence[Field], *, array_mode: bool, raw_text: bool) -> None:
        self._array_mode = array_mode
        self._keys = [json.dumps(f.name, ensure_ascii=False) + ":" for f in fields]
        self._convert: list[Convert] | None = (
            None if raw_text else [converter(f.type_id) for f in fields]
        )

    def row(self, values: Sequence[bytes | None]) -> str:
        if self._convert is None and self._array_mode:
            # The common case, what the driver asks: one dumps call for the row.
            return json.dumps(
                [None if v is None else v.decode(errors="replace") for v in values],
                ensure_ascii=False,
            )
        items = []
        for i, v in enumerate(values):
            if v is None:
                item = "null"
            elif self._convert is None:
                item = _string(v.decode(errors="replace"))
            else:
                item = self._convert[i](v.decode(errors="replace"))
            items.append(item if self._array_mode else self._keys[i] + item)
        return (
            ("[" if self._array_mode else "{")
            + ",".join(items)
            + ("]" if self._array_mode else "}")
        )


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _bool(text: str) -> str:
    return "true" if text == "t" else "false"


def _int(text: str) -> str:
    return str(int(text)) if text.lstrip("-").isdigit() else _string(text)


def _float(text: str) -> str:
    try:
        value = float(text)
    except ValueError:
        return _string(text)
    # NaN and the infinities stay text (JSON has no word for them), as Neon's proxy sends them.
    return repr(value) if math.isfinite(value) else _string(text)


def _json_value(text: str) -> str:
    return text  # Postgres' json and jsonb output is JSON


_ARRAY_ELEMENTS = {
    # array type OID: its element's (every built-in array's delimiter is "," but box's ";")
    1000: 16,
    1005: 21,
    1007: 23,
    1016: 20,
    1021: 700,
    1022: 701,
    199: 114,
    3807: 3802,
    1009: 25,
    1015: 1043,
    1014: 1042,
    1002: 18,
    1003: 19,
    1231: 1700,
    1182: 1082,
    1183: 1083,
    1115: 1114,
    1185: 1184,
    1270: 1266,
    1187: 1186,
    2951: 2950,
    1001: 17,
    1028: 26,
    1041: 869,
    651: 650,
    1040: 829,
    143: 142,
    3643: 3614,
    1017: 600,
    1018: 601,
    1019: 602,
    1027: 604,
    629: 628,
    719: 718,
    1020: 603,
}
_SCALARS: dict[int, Convert] = {
    16: _bool,
    21: _int,
    23: _int,
    700: _float,
    701: _float,
    114: _json_value,
    3802: _json_value,
}


def converter(type_id: int) -> Convert:
    """How a value of this type becomes JSON without raw text output."""
    element = _ARRAY_ELEMENTS.get(type_id)
    if element is not None:
        inner = _SCALARS.get(element, _string)
        delimiter = ";" if type_id == 1020 else ","
        return lambda text: _array(text, inner, delimiter)
    return _SCALARS.get(type_id, _string)


def _array(text: str, inner: Convert, delimiter: str) -> str:
    """An array's text (``{1,NULL,"a b"}``, nested, maybe with bounds) as a JSON array."""
    if text.startswith("["):  # [1:2]={...}: bounds JSON cannot say
        text = text.partition("=")[2]
    try:
        out, rest = _parse_array(text.strip(), 0, inner, delimiter)
    except (IndexError, ValueError):
        return _string(text)
    return out if not rest.strip() else _string(text)


def _parse_array(text: str, depth: int, inner: Convert, delimiter: str) -> tuple[str, str]:
    if depth > 6 or not text.startswith("{"):  # Postgres allows 6 dimensions
        raise ValueError(text)
    text = text[1:].lstrip()
    items: list[str] = []
    if text.startswith("}"):
        return "[]", text[1:]
    while True:
        if text.startswith("{"):
            item, text = _parse_array(text, depth + 1, inner, delimiter)
        elif text.startswith('"'):
            chars, i = [], 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                chars.append(text[i])
                i += 1
            item, text = inner("".join(chars)), text[i + 1 :]
        else:
            end = min((i for i in (text.find(delimiter), text.find("}")) if i >= 0), default=-1)
            if end < 0:
                raise ValueError(text)
            word, text = text[:end].strip(), text[end:]
            item = "null" if word == "NULL" else inner(word)
        items.append(item)
        text = text.lstrip()
        if text.startswith(delimiter):
            text = text[1:].lstrip()
            continue
        if text.startswith("}"):
            return "[" + ",".join(items) + "]", text[1:]
        raise ValueError(text)
