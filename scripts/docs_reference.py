"""MkDocs hook (mkdocs.yml ``hooks``): the reference pages, generated at each build from the
code itself, so they cannot drift from it: ``reference/api.md`` from the OpenAPI document the
API serves, ``reference/cli.md`` from the ``pgplane`` command's own help."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import typer
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

_METHODS = ("get", "post", "put", "patch", "delete")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, "reference/api.md", content=api_reference()))
    files.append(File.generated(config, "reference/cli.md", content=cli_reference()))
    return files


def openapi_document() -> dict[str, Any]:
    """The document ``GET /openapi.json`` serves, from an app over a throwaway store."""
    from pgplane.api.app import create_app  # noqa: PLC0415
    from pgplane.api.document import served  # noqa: PLC0415
    from pgplane.config import settings_from_env  # noqa: PLC0415
    from pgplane.store.sqlite import SqliteStore  # noqa: PLC0415

    async def unchecked(**_: object) -> None:
        return None

    with tempfile.TemporaryDirectory() as tmp:
        settings = settings_from_env(data_dir=Path(tmp))
        store = SqliteStore(settings.store_path)
        try:
            app = create_app(store=store, settings=settings, check_settings=unchecked)
            return served(app.openapi_schema.to_schema(), settings)
        finally:
            asyncio.run(store.close())


def api_reference() -> str:
    doc = openapi_document()
    out = [
        "# API reference",
        "",
        "Every path of the management API, as the platform's OpenAPI document"
        f" ({doc['info'].get('version', '')}) states it: the same document `GET /openapi.json`"
        " serves, and the console's API reference page renders. Every request but the health"
        " checks carries `Authorization: Bearer <key>`.",
        "",
    ]
    by_tag: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for path, item in doc["paths"].items():
        for method in _METHODS:
            op = item.get(method)
            if op is not None:
                tag = (op.get("tags") or ["Other"])[0]
                by_tag.setdefault(tag, []).append((method.upper(), path, op))
    for tag in sorted(by_tag):
        out += [f"## {tag}", ""]
        for method, path, op in by_tag[tag]:
            out += [f"### `{method} {path}`", ""]
            summary = op.get("summary") or op.get("operationId", "")
            if summary:
                out += [summary, ""]
            if op.get("description"):
                out += [op["description"].strip(), ""]
            params = op.get("parameters") or []
            if params:
                out += ["| parameter | in | required | description |", "|---|---|---|---|"]
                for p in params:
                    text = (p.get("description") or "").replace("\n", " ").replace("|", "\\|")
                    out.append(
                        f"| `{p['name']}` | {p['in']} | {'yes' if p.get('required') else 'no'}"
                        f" | {text} |"
                    )
                out.append("")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                out += [f"Body: `{_schema_name(body.get('schema', {}))}`", ""]
            codes = ", ".join(f"`{code}`" for code in op.get("responses", {}))
            out += [f"Responses: {codes}", ""]
    return "\n".join(out) + "\n"


def _schema_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref", "")
    return str(ref.rsplit("/", 1)[-1] if ref else schema.get("type", "object"))


def cli_reference() -> str:
    from pgplane.cli.main import app  # noqa: PLC0415

    root = typer.main.get_command(app)
    out = [
        "# CLI reference",
        "",
        "Each `pgplane` command's own `--help`, as this version prints it.",
        "",
    ]
    for path, command in _commands(root, ["pgplane"]):
        # Typer's own click (vendored): its commands make their own contexts.
        ctx = command.context_class(command, info_name=" ".join(path), terminal_width=100)
        help_text = command.get_help(ctx)
        out += [f"## `{' '.join(path)}`", "", "```text", help_text.rstrip(), "```", ""]
    return "\n".join(out) + "\n"


def _commands(command: Any, path: list[str]) -> list[tuple[list[str], Any]]:
    found = [(path, command)]
    for name in sorted(getattr(command, "commands", {})):
        found += _commands(command.commands[name], [*path, name])
    return found
