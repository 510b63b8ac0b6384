"""The process' log: readable text by default, or one JSON object a line for log collectors.

A JSON line has ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` and ``node`` (this
process's node name, once it is known), then the ids of
what wrote it, taken from context variables set where work starts: the API sets ``request_id``
(and ``project_id``, ``endpoint_id`` from the path) for each request, the engine sets
``operation_id``, ``project_id``, ``branch_id`` and ``endpoint_id`` for each attempt. An
operation's lines also carry the ``request_id`` of the request that asked for it, when that
request was served by this process (remembered for the last ``_REMEMBERED`` operations; a
restart forgets). A line logged with ``extra={"operation_id": …}`` names that id instead.

Messages hold what tenants chose (role names, say): JSON escapes every control character, so a
name cannot begin a line of its own or forge a field.
"""

from __future__ import annotations

import datetime
import logging
import sys
from contextvars import ContextVar

import msgspec

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

request_id: ContextVar[str | None] = ContextVar("request_id", default=None)
operation_id: ContextVar[str | None] = ContextVar("operation_id", default=None)
project_id: ContextVar[str | None] = ContextVar("project_id", default=None)
branch_id: ContextVar[str | None] = ContextVar("branch_id", default=None)
endpoint_id: ContextVar[str | None] = ContextVar("endpoint_id", default=None)
_FIELDS = (
    ("request_id", request_id),
    ("operation_id", operation_id),
    ("project_id", project_id),
    ("branch_id", branch_id),
    ("endpoint_id", endpoint_id),
)

_node: dict[str, str] = {}  # this process's node name, once known: on every JSON line

_REMEMBERED = 4096
_asked_by: dict[str, str] = {}  # operation id -> the request that queued it, oldest first


def in_operation(operation: str, *, project: str, branch: str | None, endpoint: str | None) -> None:
    """The current task runs an attempt of ``operation`` (set in the attempt's own task)."""
    operation_id.set(operation)
    project_id.set(project)
    branch_id.set(branch)
    endpoint_id.set(endpoint)
    request_id.set(_asked_by.get(operation))


def set_node(name: str) -> None:
    """Every JSON line from now on names this process's node (several share one store)."""
    _node["node"] = name


def queued(operation: str) -> None:
    """``operation`` was just committed; remember the request that asked for it, if any."""
    asked_by = request_id.get()
    if asked_by is None:
        return
    _asked_by[operation] = asked_by
    if len(_asked_by) > _REMEMBERED:
        del _asked_by[next(iter(_asked_by))]


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        created = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        entry: dict[str, str] = {
            "time": created.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **_node,
        }
        for name, var in _FIELDS:
            value = getattr(record, name, None) or var.get()
            if value:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return msgspec.json.encode(entry).decode()


def configure(level: str, form: str = "text") -> None:
    """The root logger at ``level``, writing ``form`` (``text`` or ``json``) to stderr."""
    if form not in FORMATS:
        raise ValueError(f"log format {form!r}: expected text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if form == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler])
