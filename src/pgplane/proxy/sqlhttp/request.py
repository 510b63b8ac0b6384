"""A ``POST /sql`` request as Neon's serverless driver sends it, read into what it asks for.

Everything here is attacker input: the headers and the body are read whole, bounded, and anything
malformed or not supported is refused (:class:`~pgplane.errors.SqlFailed`, HTTP 400) before the
request reaches a compute. Pure functions: no I/O.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from pgplane.errors import PayloadTooLarge, SqlFailed
from pgplane.proxy import wire
from pgplane.proxy.session import POINT_IN_TIME_REFUSED

CONNECTION_STRING = "neon-connection-string"
ARRAY_MODE = "neon-array-mode"
RAW_TEXT = "neon-raw-text-output"
ISOLATION = "neon-batch-isolation-level"
READ_ONLY = "neon-batch-read-only"
DEFERRABLE = "neon-batch-deferrable"
POOL = "neon-pool-opt-in"
_OURS = frozenset({CONNECTION_STRING, ARRAY_MODE, RAW_TEXT, ISOLATION, READ_ONLY, DEFERRABLE, POOL})

ISOLATION_LEVELS = {
    "Serializable": "SERIALIZABLE",
    "RepeatableRead": "REPEATABLE READ",
    "ReadCommitted": "READ COMMITTED",
    "ReadUncommitted": "READ UNCOMMITTED",
}
MAX_PARAMS = 65535  # Bind counts them in 16 bits
_QUERY_KEYS = frozenset({"query", "params", "arrayMode"})
_MAX_DEPTH = 64  # nesting of a parameter's JSON arrays and objects


@dataclass(frozen=True, slots=True)
class Login:
    """Who the request logs in as, and where: the connection string's parts."""

    endpoint_id: str
    role: str
    password: str
    database: str
    # Startup parameters passed on to the compute (``options`` without endpoint=,
    # ``application_name``): part of what a pooled connection is for.
    params: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    params: tuple[str | None, ...]
    array_mode: bool


@dataclass(frozen=True, slots=True)
class Transaction:
    """How a batch's transaction begins (``BEGIN`` with these)."""

    isolation: str | None = None  # SQL words: REPEATABLE READ...
    read_only: bool = False
    deferrable: bool = False

    def begin(self) -> str:
        words = ["BEGIN"]
        if self.isolation:
            words.append(f"ISOLATION LEVEL {self.isolation}")
        if self.read_only:
            words.append("READ ONLY")
        if self.deferrable:
            words.append("DEFERRABLE")
        return " ".join(words)


@dataclass(frozen=True, slots=True)
class SqlRequest:
    login: Login
    queries: tuple[Query, ...]
    batch: Transaction | None  # None: one query, replied to as itself
    raw_text: bool
    pooled: bool


def headers_of(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header names lowercased; one of ours given twice is refused (which one would count?)."""
    out: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        if key in out and key in _OURS:
            raise SqlFailed(f"header {name} given more than once")
        out[key] = value
    return out


@dataclass(frozen=True, slots=True)
class Head:
    """What the headers ask: all that is read before the request is authenticated."""

    login: Login
    array_mode: bool
    raw_text: bool
    pooled: bool
    transaction: Transaction


def parse(headers: dict[str, str], body: bytes, *, proxy_host: str, max_body: int) -> SqlRequest:
    """The request, or SqlFailed (PayloadTooLarge for a body past ``max_body``)."""
    return parse_body(
        parse_head(headers, len(body), proxy_host=proxy_host, max_body=max_body), body
    )


def parse_head(headers: dict[str, str], size: int, *, proxy_host: str, max_body: int) -> Head:
    """The headers read, and the body's ``size`` checked: cheap, so done for anyone; the body
    itself is read once the login is authenticated (a stranger's body costs no parse)."""
    if size > max_body:
        raise PayloadTooLarge(f"request body is too large (max is {max_body} bytes)")
    _refuse_unsupported(headers)
    login = parse_connection_string(headers.get(CONNECTION_STRING), proxy_host=proxy_host)
    level = headers.get(ISOLATION)
    if level is not None and level not in ISOLATION_LEVELS:
        raise SqlFailed(f"invalid isolation level {level!r}: one of {', '.join(ISOLATION_LEVELS)}")
    transaction = Transaction(
        ISOLATION_LEVELS[level] if level else None,
        _flag(headers, READ_ONLY),
        _flag(headers, DEFERRABLE),
    )
    return Head(
        login=login,
        array_mode=_flag(headers, ARRAY_MODE),
        raw_text=_flag(headers, RAW_TEXT),
        pooled=_flag(headers, POOL, default=True),
        transaction=transaction,
    )


def parse_body(head: Head, body: bytes) -> SqlRequest:
    """The queries the body holds, as ``head`` says to read them."""
    payload = _json(body)
    array_mode = head.array_mode
    if "queries" in payload:
        if set(payload) != {"queries"}:
            raise SqlFailed('a batch is {"queries": [...]} and nothing else')
        items = payload["queries"]
        if not isinstance(items, list):
            raise SqlFailed('"queries" must be a list of {"query", "params"} objects')
        queries = tuple(_query(item, array_mode) for item in items)
        return SqlRequest(head.login, queries, head.transaction, head.raw_text, head.pooled)
    if head.transaction != Transaction():
        raise SqlFailed("the Neon-Batch-* headers apply to a batch of queries only")
    return SqlRequest(head.login, (_query(payload, array_mode),), None, head.raw_text, head.pooled)


def _refuse_unsupported(headers: dict[str, str]) -> None:
    if "authorization" in headers:
        raise SqlFailed(
            "authentication with a token (Authorization header, the driver's authToken) is not"
            " supported here: put the role's password in the connection string"
        )
    for name in headers:
        if name.startswith("neon-") and name not in _OURS:
            raise SqlFailed(f"header {name} is not supported")


def _flag(headers: dict[str, str], name: str, *, default: bool = False) -> bool:
    value = headers.get(name)
    if value is None:
        return default
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise SqlFailed(f"header {name} must be true or false, not {value[:40]!r}")


def parse_connection_string(uri: str | None, *, proxy_host: str) -> Login:
    """The ``Neon-Connection-String`` header: ``postgresql://role:password@host/db?...``."""
    if not uri:
        raise SqlFailed("missing the Neon-Connection-String header (the connection URI)")
    if len(uri) > _CACHED_URI_LENGTH:
        return _parse_connection_string(uri, proxy_host)
    return _parsed_connection_string(uri, proxy_host)


# A client sends the same connection string with every request, and parsing it (urllib) costs
# more than the rest of a small request's reading: what it parses to is kept, for the usual
# lengths. Only the parse is kept (a pure function of the text; a refusal is not kept): who
# may log in with it is decided for every request, against the store.
_CACHED_URI_LENGTH = 1024
_CACHED_URIS = 256


@functools.lru_cache(maxsize=_CACHED_URIS)
def _parsed_connection_string(uri: str, proxy_host: str) -> Login:
    return _parse_connection_string(uri, proxy_host)


def _parse_connection_string(uri: str, proxy_host: str) -> Login:
    try:
        parts = urlsplit(uri)
        host = parts.hostname
        query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError:
        raise SqlFailed("the connection string is not a valid URI") from None
    if parts.scheme not in ("postgres", "postgresql"):
        raise SqlFailed("the connection string must start with postgresql://")
    if not parts.username:
        raise SqlFailed("the connection string names no role")
    if parts.password is None:
        raise SqlFailed("the connection string holds no password")
    database = unquote(parts.path.removeprefix("/"))
    if not database or "/" in database:
        raise SqlFailed("the connection string names no database")
    params = dict(query)
    if len(params) != len(query):
        raise SqlFailed("a connection string parameter is given more than once")
    option_endpoint, forwarded = _startup_params(params)
    host_endpoint = wire.endpoint_from_sni(host, proxy_host)
    if option_endpoint and host_endpoint and option_endpoint != host_endpoint:
        raise SqlFailed("the connection string names two endpoints (its host and its options)")
    endpoint_id = option_endpoint or host_endpoint
    if endpoint_id is None:
        raise SqlFailed(
            f"endpoint not specified: the connection string's host must be ep-<id>.{proxy_host}"
            " or its options endpoint=<id>, as in the connection URI the API returns",
            {"code": wire.CONNECTION_REJECTED},
        )
    login = Login(
        endpoint_id, unquote(parts.username), unquote(parts.password), database, forwarded
    )
    for text in (login.role, login.password, login.database, *(v for _, v in forwarded)):
        if "\0" in text:
            raise SqlFailed("the connection string holds a NUL character")
    return login


def _startup_params(
    params: dict[str, str],
) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """The endpoint named in ``options``, and what is passed on to the compute: the rest of
    ``options`` and ``application_name`` (libpq's other parameters are the client's own)."""
    forwarded: list[tuple[str, str]] = []
    endpoint = None
    if "options" in params:
        startup = wire.Startup(wire.PROTOCOL_3, {"user": "-", "options": params["options"]})
        if wire.asks_point_in_time(startup):
            raise SqlFailed(POINT_IN_TIME_REFUSED, {"code": wire.FEATURE_NOT_SUPPORTED})
        endpoint, rest = wire.take_endpoint_option(startup)
        if "options" in rest.params:
            forwarded.append(("options", rest.params["options"]))
    if params.get("application_name"):
        forwarded.append(("application_name", params["application_name"]))
    return endpoint, tuple(forwarded)


def _json(body: bytes) -> dict[str, Any]:
    try:
        payload = json.loads(body, parse_constant=_no_constant)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise SqlFailed("the request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise SqlFailed('the request body must be a JSON object: {"query", "params"}')
    return payload


def _no_constant(name: str) -> None:
    raise ValueError(name)  # NaN, Infinity: not JSON


def _query(item: object, default_array_mode: bool) -> Query:
    if not isinstance(item, dict):
        raise SqlFailed('each query must be a {"query", "params"} object')
    unknown = set(item) - _QUERY_KEYS
    if unknown:
        raise SqlFailed(f"unknown field {sorted(unknown)[0]!r} in a query")
    text = item.get("query")
    if not isinstance(text, str):
        raise SqlFailed('"query" must be a string')
    if "\0" in text:
        raise SqlFailed("the query holds a NUL character")
    params = item.get("params", [])
    if params is None:
        params = []
    if not isinstance(params, list):
        raise SqlFailed('"params" must be a list')
    if len(params) > MAX_PARAMS:
        raise SqlFailed(f"too many parameters (max is {MAX_PARAMS})")
    array_mode = item.get("arrayMode", default_array_mode)
    if not isinstance(array_mode, bool):
        raise SqlFailed('"arrayMode" must be true or false')
    return Query(text, tuple(param_text(p) for p in params), array_mode)


def param_text(value: object) -> str | None:
    """A JSON parameter as the text Postgres is sent, as Neon's proxy makes it: strings as they
    are, null as NULL, arrays as array literals, everything else as its JSON text."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _array_literal(value, 0)
    return _json_text(value)


def _json_text(value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        raise SqlFailed("a parameter is not a finite number")
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _array_literal(values: list[object], depth: int) -> str:
    if depth > _MAX_DEPTH:
        raise SqlFailed("a parameter's arrays are nested too deep")
    items = []
    for v in values:
        if v is None:
            items.append("NULL")
        elif isinstance(v, list):
            items.append(_array_literal(v, depth + 1))
        elif isinstance(v, str):
            items.append(_quoted(v))
        elif isinstance(v, dict):
            items.append(_quoted(_json_text(v)))
        elif type(v) is int:  # the common case, without json.dumps' cost per element
            items.append(str(v))
        else:
            items.append(_json_text(v))
    return "{" + ",".join(items) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
