"""The proxy's HTTP replies, as the door writes them: every one a JSON body, errors with a code."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    429: "Too Many Requests",
    413: "Payload Too Large",
    426: "Upgrade Required",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_CODES = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    408: "REQUEST_TIMEOUT",
    429: "TOO_MANY_REQUESTS",
    413: "PAYLOAD_TOO_LARGE",
    431: "REQUEST_HEADER_FIELDS_TOO_LARGE",
    500: "INTERNAL",
    503: "SERVICE_UNAVAILABLE",
}


@dataclass(frozen=True, slots=True)
class HttpReply:
    status: int
    body: bytes
    headers: list[tuple[str, str]] = field(default_factory=list)  # besides the body's own

    @classmethod
    def json(
        cls, status: int, value: Any, headers: list[tuple[str, str]] | None = None
    ) -> HttpReply:
        return cls(status, json.dumps(value).encode(), headers or [])

    @classmethod
    def error(
        cls,
        status: int,
        message: str,
        code: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> HttpReply:
        body = {"code": code or _CODES.get(status, "ERROR"), "message": message}
        return cls.json(status, body, headers)


def _headers(reply: HttpReply) -> list[tuple[str, str]]:
    return [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(reply.body))),
        *reply.headers,
    ]


def render_reply(
    reply: HttpReply, *, head_only: bool, close: bool, keep_alive: str | None
) -> bytes:
    """The reply in one write: status line, headers and body."""
    headers = _headers(reply)
    if close:
        headers.append(("Connection", "close"))
    elif keep_alive is not None:
        headers.append(("Keep-Alive", keep_alive))
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, '')}"]
    for name, value in headers:
        if "\r" in value or "\n" in value:  # never from this proxy's handlers; never sent
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head if head_only else head + reply.body


def raw_reply(reply: HttpReply) -> bytes:
    """A reply written without the parser's state (it may be broken): the connection closes."""
    lines = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Error')}"]
    lines += [f"{k}: {v}" for k, v in [*_headers(reply), ("Connection", "close")]]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + reply.body
