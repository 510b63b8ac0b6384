"""What nodes say to each other over the node channel: one request per connection, one answer.

Each message is a frame: its length (4 bytes, big-endian) and a msgpack map tagged with its kind.
A request is read within the door's deadline and bounded (:data:`MAX_REQUEST`); an answer is
bounded by what the asker expects of it (a schema's SQL can be large). After a
:class:`Connected` answer the connection carries the proxied session's bytes both ways, as a
connection to the compute itself would.

A request says only what the asking node knows and the owning node cannot: the login it
authenticated (endpoint, role, startup parameters) and the client's address. The owning node
reads everything else from the store itself (the role's secret, the allow-list, where the
compute runs), so a node is trusted with no more than "this login was authenticated".
"""

from __future__ import annotations

import struct

import msgspec

MAX_REQUEST = 64 * 1024
MAX_ANSWER = 1 << 20  # any answer but a schema's SQL, whose bound the asker adds
_HEADER = struct.Struct("!I")


class MessageError(Exception):
    """A frame too large, or not a message of this protocol."""


# Requests --------------------------------------------------------------------------------


class Connect(msgspec.Struct, frozen=True, tag="connect"):
    """A session to the endpoint's compute, for a client the asking node authenticated as
    ``params["user"]``, connecting from ``client``; woken first if it sleeps."""

    endpoint_id: str
    version: int  # the StartupMessage's protocol version
    params: dict[str, str]
    client: str


class Cancel(msgspec.Struct, frozen=True, tag="cancel"):
    """A client's CancelRequest for a session the asked node pipes (its key, which the asking
    node saw at login, is the proof); no answer."""

    pid: int
    key: bytes


class RoleVerifier(msgspec.Struct, frozen=True, tag="role_verifier"):
    """The SCRAM verifier of a role made with SQL, as the endpoint's running compute holds it."""

    endpoint_id: str
    role: str


class HistoryBoundsAsk(msgspec.Struct, frozen=True, tag="history_bounds"):
    project_id: str
    branch_id: str
    pg_version: int


class SchemaAsk(msgspec.Struct, frozen=True, tag="schema"):
    project_id: str
    branch_id: str
    pg_version: int
    db_name: str
    max_bytes: int
    lsn: int | None = None
    time_us: int | None = None


Request = Connect | Cancel | RoleVerifier | HistoryBoundsAsk | SchemaAsk

# Answers ---------------------------------------------------------------------------------


class Connected(msgspec.Struct, frozen=True, tag="connected"):
    """The session is logged in: the compute's replies up to ReadyForQuery (or Postgres' own
    refusal, an ErrorResponse last), for the client. The session's bytes follow."""

    reply: bytes


class Refused(msgspec.Struct, frozen=True, tag="refused"):
    """A login the owning node will not serve, in the proxy's words (SQLSTATE ``code``)."""

    code: str
    message: str
    severity: str = "FATAL"


class NotHere(msgspec.Struct, frozen=True, tag="not_here"):
    """The project is not placed on the asked node (it moved): ask the store again."""

    message: str


class Failed(msgspec.Struct, frozen=True, tag="failed"):
    """A read that failed, by ``kind`` (the exception the owning node met, named in
    :mod:`pgplane.engine.project_data`)."""

    kind: str
    message: str


class Verifier(msgspec.Struct, frozen=True, tag="verifier"):
    answered: bool  # False: the compute could not be asked (the last sync decides)
    verifier: str | None = None


class Bounds(msgspec.Struct, frozen=True, tag="bounds"):
    start_lsn: int | None = None
    start_time_us: int | None = None
    head_lsn: int | None = None


class Schema(msgspec.Struct, frozen=True, tag="schema"):
    sql: str


Answer = Connected | Refused | NotHere | Failed | Verifier | Bounds | Schema

_requests = msgspec.msgpack.Decoder(Request)
_answers = msgspec.msgpack.Decoder(Answer)
_encoder = msgspec.msgpack.Encoder()


def frame(message: Request | Answer) -> bytes:
    body = _encoder.encode(message)
    return _HEADER.pack(len(body)) + body


def length(header: bytes, *, limit: int) -> int:
    """A frame's length from its 4-byte header; MessageError past ``limit``."""
    (size,) = _HEADER.unpack(header)
    if size > limit:
        raise MessageError(f"a node channel message of {size} bytes, past its bound of {limit}")
    return int(size)


HEADER = _HEADER.size


def request(body: bytes) -> Request:
    try:
        return _requests.decode(body)
    except msgspec.DecodeError as exc:
        raise MessageError(f"not a node channel request: {exc}") from None


def answer(body: bytes) -> Answer:
    try:
        return _answers.decode(body)
    except msgspec.DecodeError as exc:
        raise MessageError(f"not a node channel answer: {exc}") from None
