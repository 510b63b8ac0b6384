"""The few pieces of the Postgres wire protocol the proxy reads and writes.

The proxy understands only what comes before authentication: the first packet (SSLRequest,
GSSENCRequest, CancelRequest or StartupMessage) and the server's first reply. Everything after
that is piped as bytes; only the backend's cancel key is noticed on the way past.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
PROTOCOL_3 = 3 << 16
MAX_STARTUP = 10_000  # as Postgres: a longer startup packet is refused

# SQLSTATEs the proxy answers with.
PROTOCOL_VIOLATION = "08P01"
CONNECTION_REJECTED = "08004"  # unknown or disabled endpoint
CANNOT_CONNECT_NOW = "57P03"  # a compute starting up or shutting down
# What a compute says to a session it ends because it is going down: a shutdown (the postmaster's
# SIGINT terminates every backend, one still logging in too) or a crash of another backend.
ADMIN_SHUTDOWN = "57P01"
CRASH_SHUTDOWN = "57P02"
CONNECTION_FAILURE = "08006"  # the compute could not be started or reached
TOO_MANY_CONNECTIONS = "53300"  # past the proxy's connection caps (connlimits.py)
CONFIGURATION_LIMIT_EXCEEDED = "53400"  # a wake past the account's compute quotas
INVALID_PASSWORD = "28P01"  # noqa: S105 - a SQLSTATE, not a password
FEATURE_NOT_SUPPORTED = "0A000"
# Neon's proxy sends every refusal of its own, an address off the allow-list too, as XX000 with
# severity ERROR (proxy/src/stream.rs, SQLSTATE_INTERNAL_ERROR); that refusal is sent as Neon
# sends it, so clients that look for it find it.
INTERNAL_ERROR = "XX000"

# Authentication request codes (the Int32 after an 'R').
AUTH_OK = 0
AUTH_CLEARTEXT = 3
AUTH_SASL = 10
AUTH_SASL_CONTINUE = 11
AUTH_SASL_FINAL = 12

_ENDPOINT_OPTION = re.compile(r"(?:^|\s)(?:--)?endpoint=(\S+)")
_ENDPOINT_ID = re.compile(r"ep-[a-z0-9-]{1,57}")


class ProtocolViolation(Exception):
    """The client sent something that is not the start of a Postgres session."""


@dataclass(frozen=True, slots=True)
class Startup:
    version: int
    params: dict[str, str]

    def encode(self) -> bytes:
        body = struct.pack("!I", self.version)
        for key, value in self.params.items():
            body += key.encode() + b"\0" + value.encode() + b"\0"
        body += b"\0"
        return struct.pack("!I", len(body) + 4) + body


def parse_startup(version: int, payload: bytes) -> Startup:
    """The parameters of a StartupMessage (``payload`` follows the version)."""
    if version >> 16 != 3:
        raise ProtocolViolation(f"unsupported frontend protocol {version >> 16}.{version & 0xFFFF}")
    # name\0value\0 ... \0: the list ends with an empty name.
    if not payload.endswith(b"\0\0") and payload != b"\0":
        raise ProtocolViolation("malformed startup packet")
    fields = payload[:-2].split(b"\0") if payload != b"\0" else []
    if len(fields) % 2:
        raise ProtocolViolation("malformed startup packet")
    try:
        decoded = [f.decode() for f in fields]
    except UnicodeDecodeError:
        raise ProtocolViolation("startup packet is not valid UTF-8") from None
    params = dict(zip(decoded[::2], decoded[1::2], strict=True))
    if not params.get("user"):
        raise ProtocolViolation("no PostgreSQL user name specified in startup packet")
    return Startup(version, params)


def endpoint_from_sni(server_name: str | None, proxy_host: str) -> str | None:
    """``ep-x.<proxy_host>`` (or neonctl's pooled ``ep-x-pooler.<proxy_host>``) names ep-x."""
    if not server_name:
        return None
    label, _, rest = server_name.lower().partition(".")
    if rest != proxy_host.lower():
        return None
    label = label.removesuffix("-pooler")
    return label if _ENDPOINT_ID.fullmatch(label) else None


# Neon's "time travel" connections: ``options=neon_lsn:…`` / ``neon_timestamp:…`` (neonctl's
# ``connection-string <branch>@<point>`` also names the branch where the endpoint would be).
_POINT_OPTION = re.compile(r"(?:^|\s)neon_(?:lsn|timestamp):\S*")


def asks_point_in_time(startup: Startup) -> bool:
    """Whether the client asks to connect to a branch as it was at a point in time."""
    return _POINT_OPTION.search(startup.params.get("options", "")) is not None


def take_endpoint_option(startup: Startup) -> tuple[str | None, Startup]:
    """``options=endpoint=ep-x`` (Neon's way for clients without SNI), removed from options.

    Postgres would refuse the unknown word in ``options``; what else the client put there
    (``-c`` settings) is passed on unchanged.
    """
    options = startup.params.get("options")
    if options is None:
        return None, startup
    match = _ENDPOINT_OPTION.search(options)
    if match is None:
        return None, startup
    rest = (options[: match.start()] + " " + options[match.end() :]).strip()
    params = dict(startup.params)
    if rest:
        params["options"] = rest
    else:
        del params["options"]
    return match.group(1), Startup(startup.version, params)


# Said with every wrong password (as its HINT): an endpoint id mistyped in the host fails the
# same way, for nobody may learn from the answer whether an endpoint exists.
MISTYPED_HOST_HINT = (
    "Check the password, and the endpoint id in the host (ep-...): a mistyped one fails the"
    " same way. The console and the API's connection_uri give both."
)


def hint_for(refusal: str) -> str:
    """The HINT a SCRAM refusal goes with: the wrong password's (a malformed exchange has
    none)."""
    return MISTYPED_HOST_HINT if refusal.startswith("password authentication failed") else ""


def error_response(code: str, message: str, *, severity: str = "FATAL", hint: str = "") -> bytes:
    fields = b""
    for tag, value in ((b"S", severity), (b"V", severity), (b"C", code), (b"M", message)):
        fields += tag + value.encode() + b"\0"
    if hint:
        fields += b"H" + hint.encode() + b"\0"
    fields += b"\0"
    return b"E" + struct.pack("!I", len(fields) + 4) + fields


def error_fields(payload: bytes) -> dict[str, str]:
    """The fields of an ErrorResponse body, by their one-letter tag."""
    out = {}
    for part in payload.split(b"\0"):
        if part:
            out[chr(part[0])] = part[1:].decode(errors="replace")
    return out


def auth_message(code: int, data: bytes = b"") -> bytes:
    return b"R" + struct.pack("!II", len(data) + 8, code) + data


def password_message(data: bytes) -> bytes:
    return b"p" + struct.pack("!I", len(data) + 4) + data


def sasl_initial(mechanism: str, data: bytes) -> bytes:
    return password_message(mechanism.encode() + b"\0" + struct.pack("!i", len(data)) + data)


def parse_sasl_initial(payload: bytes) -> tuple[str, str]:
    """SASLInitialResponse: the mechanism and the client-first-message."""
    name, sep, rest = payload.partition(b"\0")
    if not sep or len(rest) < 4:
        raise ProtocolViolation("malformed SASLInitialResponse")
    (length,) = struct.unpack("!i", rest[:4])
    data = rest[4:]
    if length != len(data):
        raise ProtocolViolation("malformed SASLInitialResponse")
    try:
        return name.decode(), data.decode()
    except UnicodeDecodeError:
        raise ProtocolViolation("malformed SASLInitialResponse") from None


def cancel_request(pid: int, key: bytes) -> bytes:
    return struct.pack("!III", 12 + len(key), CANCEL_REQUEST, pid) + key
