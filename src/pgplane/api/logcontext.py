"""Each request's ids in the log's context (telemetry/logs.py), for the lines it causes.

The request id is chosen once, as the request arrives: the client's ``X-Request-ID`` when it is
sane (errors.py says what that means), else a fresh one; the error body names the same one, so a
client's report leads to the server's lines. The project, branch and endpoint come from the
path, once routing has parsed it, and only when they are shaped like ids: a path is attacker
input, and the log is no place for whatever a client put there.
"""

from __future__ import annotations

import itertools
import re
import uuid
from typing import Any

from litestar.enums import ScopeType
from litestar.types import ASGIApp, Receive, Scope, Send

from pgplane.api.errors import sane_request_id
from pgplane.telemetry import logs

_ID = re.compile(r"^[a-z0-9-]{1,64}$")
_HEADER = b"x-request-id"
# A made id: this process' random half, then a count. As unique as a random id per request, at a
# tenth of the cost on the hottest path (no system call for randomness per request); an id is no
# secret, so that the next one can be guessed gives nothing away.
_PROCESS = uuid.uuid4().hex[:16]
_count = itertools.count(1)


def with_request_ids(app: ASGIApp) -> ASGIApp:
    """``app``, each HTTP request of it with its request id in context.

    Outside the framework: uvicorn runs each request in a task of its own, so what is set here
    holds for that request alone, in its handlers, hooks and error handlers alike.
    """

    async def identified(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == ScopeType.HTTP:
            given = next((v for k, v in scope["headers"] if k == _HEADER), None)
            chosen = None if given is None else sane_request_id(given.decode("latin-1"))
            logs.request_id.set(chosen or f"{_PROCESS}{next(_count):016x}")
        await app(scope, receive, send)

    return identified


def note_path_ids(path_params: dict[str, Any]) -> None:
    """The project, branch and endpoint a request's path names, for its log lines."""
    for name, var in (
        ("project_id", logs.project_id),
        ("branch_id", logs.branch_id),
        ("endpoint_id", logs.endpoint_id),
    ):
        value = path_params.get(name)
        if isinstance(value, str) and _ID.match(value):
            var.set(value)
