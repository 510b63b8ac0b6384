"""The HTTP/1.1 protocol the API is served with: uvicorn's (httptools), with one change.

A request too malformed to reach the application (a broken request line or header) is answered
by the protocol itself, which uvicorn does in plain text. Every error this API gives is the JSON
error body, so this one is too; like uvicorn's, it closes the connection after.
"""

from __future__ import annotations

import uuid

import msgspec
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pgplane.api.schemas import ErrorBody
from pgplane.errors import BadRequest

MALFORMED = "malformed HTTP request: the request line or a header could not be parsed"


class HttpProtocol(HttpToolsProtocol):
    def send_400_response(self, msg: str) -> None:
        body = msgspec.json.encode(
            ErrorBody(code=BadRequest.code, message=MALFORMED, request_id=uuid.uuid4().hex)
        )
        head = [b"HTTP/1.1 400 Bad Request\r\n"]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
        ]
        self.transport.write(b"".join(head) + body)
        self.transport.close()
