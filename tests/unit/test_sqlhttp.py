"""SQL over HTTP's pure parts: reading a request, the messages to a compute, the JSON answer."""

from __future__ import annotations

import json
import struct

import pytest

from pgplane.errors import PayloadTooLarge, SqlFailed
from pgplane.proxy.activity import Activity
from pgplane.proxy.doors.http import HttpRequest
from pgplane.proxy.framing import frame
from pgplane.proxy.seam import Route, Target
from pgplane.proxy.session import Sessions
from pgplane.proxy.sqlhttp import messages, render
from pgplane.proxy.sqlhttp.handler import SqlOverHttp
from pgplane.proxy.sqlhttp.messages import Field
from pgplane.proxy.sqlhttp.request import (
    Login,
    Query,
    SqlRequest,
    Transaction,
    headers_of,
    param_text,
    parse,
    parse_connection_string,
)
from pgplane.proxy.throttle import LoginThrottle

EP = "ep-cool-lake-123456"
URI = f"postgresql://alice:s%40cret@{EP}.localhost/neondb?sslmode=require"


def _parse(body: object, **headers: str) -> SqlRequest:
    given = {"neon-connection-string": URI, **{k.replace("_", "-"): v for k, v in headers.items()}}
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse(given, raw, proxy_host="localhost", max_body=1 << 20)


def test_a_connection_string_names_endpoint_role_password_and_database() -> None:
    assert parse_connection_string(URI, proxy_host="localhost") == Login(
        EP, "alice", "s@cret", "neondb"
    )
    pooled = URI.replace(EP, f"{EP}-pooler")
    assert parse_connection_string(pooled, proxy_host="localhost").endpoint_id == EP
    # Without wildcard DNS the API's URIs name the proxy and pass the endpoint in options.
    by_option = (
        "postgres://alice:pw@localhost:5433/db?sslmode=require"
        f"&options=endpoint%3D{EP}%20-c%20search_path%3Dx&application_name=app"
    )
    assert parse_connection_string(by_option, proxy_host="localhost") == Login(
        EP, "alice", "pw", "db", (("options", "-c search_path=x"), ("application_name", "app"))
    )


@pytest.mark.parametrize(
    ("uri", "words"),
    [
        (None, "missing the Neon-Connection-String"),
        ("mysql://a:b@ep-x-1.localhost/db", "postgresql://"),
        (f"postgresql://{EP}.localhost/db", "names no role"),
        (f"postgresql://alice@{EP}.localhost/db", "no password"),
        (f"postgresql://alice:pw@{EP}.localhost/", "names no database"),
        ("postgresql://alice:pw@localhost/db", "endpoint not specified"),
        ("postgresql://alice:pw@ep-a-1.elsewhere/db", "endpoint not specified"),
        (
            f"postgresql://alice:pw@{EP}.localhost/db?options=endpoint%3Dep-other-1",
            "two endpoints",
        ),
        (f"postgresql://alice:pw@{EP}.localhost/db?options=neon_lsn:0/1", "point in time"),
        (f"postgresql://alice:p%00w@{EP}.localhost/db", "NUL"),
        (f"postgresql://alice:pw@[{EP}/db", "not a valid URI"),
    ],
)
def test_bad_connection_strings_are_refused(uri: str | None, words: str) -> None:
    with pytest.raises(SqlFailed, match=words):
        parse_connection_string(uri, proxy_host="localhost")


def test_one_query_and_a_batch() -> None:
    one = _parse({"query": "SELECT $1", "params": ["x", None, 1, True, {"a": 1}]})
    assert one.queries == (Query("SELECT $1", ("x", None, "1", "true", '{"a":1}'), False),)
    assert one.batch is None and one.raw_text is False and one.pooled is True
    batch = _parse(
        {"queries": [{"query": "SELECT 1"}, {"query": "SELECT 2", "arrayMode": False}]},
        neon_array_mode="true",
        neon_raw_text_output="true",
        neon_batch_isolation_level="Serializable",
        neon_batch_read_only="true",
        neon_batch_deferrable="true",
    )
    assert [q.array_mode for q in batch.queries] == [True, False]
    assert batch.batch == Transaction("SERIALIZABLE", True, True)
    assert batch.batch.begin() == "BEGIN ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE"


def test_parameters_become_text_as_neons_proxy_makes_them() -> None:
    assert param_text([1, None, 'a"b\\c', [True, {"k": "v"}]]) == (
        '{1,NULL,"a\\"b\\\\c",{true,"{\\"k\\":\\"v\\"}"}}'
    )
    assert param_text(1.5) == "1.5"


@pytest.mark.parametrize(
    ("body", "headers", "words"),
    [
        (b"not json", {}, "not valid JSON"),
        (b'{"query": "SELECT 1", "params": [NaN]}', {}, "not valid JSON"),
        (b"[1]", {}, "JSON object"),
        ({"query": 1}, {}, "must be a string"),
        ({"query": "SELECT \x00"}, {}, "NUL"),
        ({"query": "x", "params": "y"}, {}, '"params" must be a list'),
        ({"query": "x", "params": [0] * 65536}, {}, "too many parameters"),
        ({"query": "x", "extra": 1}, {}, "unknown field 'extra'"),
        ({"queries": "x"}, {}, "must be a list"),
        ({"queries": [1]}, {}, "object"),
        ({"queries": [], "query": "x"}, {}, "nothing else"),
        ({"query": "x"}, {"neon_array_mode": "yes"}, "true or false"),
        ({"query": "x"}, {"neon_batch_isolation_level": "Chaos"}, "invalid isolation level"),
        ({"query": "x"}, {"neon_batch_read_only": "true"}, "batch of queries only"),
        ({"query": "x"}, {"authorization": "Bearer abc"}, "token"),
        ({"query": "x"}, {"neon-future-thing": "1"}, "not supported"),
        ({"query": "x", "params": [[[[[[]]]]] * 1]}, {}, None),
    ],
)
def test_bad_requests_are_refused_as_400(
    body: object, headers: dict[str, str], words: str | None
) -> None:
    if words is None:
        _parse(body, **headers)
        return
    with pytest.raises(SqlFailed, match=words):
        _parse(body, **headers)


def test_bounds_on_the_body_and_repeated_headers() -> None:
    with pytest.raises(PayloadTooLarge):
        parse({}, b" " * 101, proxy_host="localhost", max_body=100)
    deep: object = []
    for _ in range(100):
        deep = [deep]
    with pytest.raises(SqlFailed, match="nested too deep"):
        _parse({"query": "x", "params": [deep]})
    with pytest.raises(SqlFailed, match="more than once"):
        headers_of([("Neon-Array-Mode", "true"), ("neon-array-mode", "false")])
    assert headers_of([("X-A", "1"), ("x-a", "2")]) == {"x-a": "2"}


def test_a_query_is_parse_bind_describe_execute() -> None:
    sent = messages.query("SELECT $1, $2", ("é", None))
    parse_ = frame(b"P", b"\0SELECT $1, $2\0\0\0")
    bind = frame(
        b"B",
        b"\0\0"
        + struct.pack("!hH", 0, 2)
        + struct.pack("!i", 2)
        + "é".encode()
        + struct.pack("!i", -1)
        + struct.pack("!hh", 1, 0),
    )
    assert sent == parse_ + bind + frame(b"D", b"P\0") + frame(b"E", b"\0\0\0\0\0")


def test_replies_are_read() -> None:
    payload = struct.pack("!h", 1) + b"x\0" + struct.pack("!IhIhih", 16384, 2, 23, 4, -1, 0)
    assert messages.row_description(payload) == [Field("x", 16384, 2, 23, 4, -1)]
    row = struct.pack("!h", 2) + struct.pack("!i", 2) + b"42" + struct.pack("!i", -1)
    assert messages.data_row(row) == [b"42", None]
    with pytest.raises(messages.MalformedMessage):
        messages.data_row(row + b"junk")
    assert messages.command_tag(b"INSERT 0 5\0") == ("INSERT", 5)
    assert messages.command_tag(b"SELECT 3\0") == ("SELECT", 3)
    assert messages.command_tag(b"CREATE TABLE\0") == ("CREATE", None)
    key = frame(b"K", struct.pack("!I", 7) + b"secret")
    refusal = frame(b"E", b"C3D000\0Mno such database\0\0")
    assert messages.login_reply(frame(b"R", b"\0\0\0\0") + key + frame(b"Z", b"I")) == (
        (7, b"secret"),
        None,
    )
    assert messages.login_reply(refusal)[1] == b"C3D000\0Mno such database\0\0"


def test_results_are_rendered_as_the_driver_parses_them() -> None:
    fields = [Field("n", 0, 0, 23, 4, -1), Field("t", 0, 0, 25, -1, -1)]
    raw = render.RowWriter(fields, array_mode=True, raw_text=True)
    assert raw.row([b"1", None]) == '["1", null]'
    keyed = render.RowWriter(fields, array_mode=False, raw_text=True)
    assert json.loads(keyed.row([b"1", b"a"])) == {"n": "1", "t": "a"}
    body = render.result_json(
        "SELECT", 1, render.fields_json(fields), [raw.row([b"1", None])], True
    )
    assert json.loads(body) == {
        "command": "SELECT",
        "rowCount": 1,
        "rows": [["1", None]],
        "fields": [
            {
                "name": "n",
                "dataTypeID": 23,
                "tableID": 0,
                "columnID": 0,
                "dataTypeSize": 4,
                "dataTypeModifier": -1,
                "format": "text",
            },
            {
                "name": "t",
                "dataTypeID": 25,
                "tableID": 0,
                "columnID": 0,
                "dataTypeSize": -1,
                "dataTypeModifier": -1,
                "format": "text",
            },
        ],
        "rowAsArray": True,
    }


@pytest.mark.parametrize(
    ("type_id", "text", "value"),
    [
        (16, "t", True),
        (23, "-42", -42),
        (20, "9007199254740993", "9007199254740993"),  # int8 stays text
        (701, "1.5", 1.5),
        (701, "NaN", "NaN"),
        (3802, '{"a": [1, null]}', {"a": [1, None]}),
        (1007, "{1,NULL,3}", [1, None, 3]),
        (1009, '{"a b","c\\"d",NULL,"NULL"}', ["a b", 'c"d', None, "NULL"]),
        (1007, "[0:1]={{1,2},{3,4}}", [[1, 2], [3, 4]]),
        (1000, "{}", []),
        (1007, "{1,2", "{1,2"),  # not an array after all: its text
        (25, "plain", "plain"),
    ],
)
def test_without_raw_text_values_become_json(type_id: int, text: str, value: object) -> None:
    writer = render.RowWriter([Field("v", 0, 0, type_id, -1, -1)], array_mode=True, raw_text=False)
    assert json.loads(writer.row([text.encode()])) == [value]


def test_error_fields_are_named_as_the_driver_reads_them() -> None:
    fields = {"S": "ERREUR", "V": "ERROR", "C": "42703", "M": "no", "P": "8", "n": "c_pkey"}
    assert render.error_fields(fields) == {
        "code": "42703",
        "position": "8",
        "constraint": "c_pkey",
        "severity": "ERROR",
    }


class _NoPlatform:
    """A platform that must not be asked: the requests below are answered before any route."""

    async def route(self, endpoint_id: str, role: str, *, client: str) -> Route:
        raise AssertionError("routed")

    async def wake(self, endpoint_id: str, *, force: bool) -> Target:
        raise AssertionError("woken")


def _handler() -> SqlOverHttp:
    sessions = Sessions(
        computes=_NoPlatform(),
        activity=Activity(),
        proxy_host="localhost",
        throttle=LoginThrottle(),
        handshake_timeout=30,
    )
    return SqlOverHttp(sessions=sessions)


def _request(method: str, body: bytes = b"", **headers: str) -> HttpRequest:
    return HttpRequest(
        method=method,
        target="/sql",
        headers=[(k.replace("_", "-"), v) for k, v in headers.items()],
        body=body,
        peer="127.0.0.1",
        tls=True,
    )


async def test_the_door_gets_a_preflight_a_405_and_header_refusals_before_any_route() -> None:
    """What the headers alone refuse is refused before any route; the body is read only once
    its sender is authenticated (tests/e2e/test_walls_sqlhttp.py)."""
    handler = _handler()
    preflight = await handler.handle(_request("OPTIONS"))
    assert preflight.status == 200
    allowed = dict(preflight.headers)["Access-Control-Allow-Headers"]
    assert "Neon-Connection-String" in allowed and "Neon-Batch-Deferrable" in allowed
    wrong = await handler.handle(_request("GET"))
    assert wrong.status == 405 and ("Allow", "OPTIONS, POST") in wrong.headers
    bad = await handler.handle(
        _request("POST", b"{", neon_connection_string=URI, neon_array_mode="x")
    )
    assert bad.status == 400 and "neon-array-mode" in json.loads(bad.body)["message"]
    nowhere = await handler.handle(_request("POST", b'{"query": "SELECT 1"}'))
    assert nowhere.status == 400 and "Neon-Connection-String" in json.loads(nowhere.body)["message"]
