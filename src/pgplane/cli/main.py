"""``pgplane serve`` and ``pgplane api-keys create``."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Annotated

import typer

from pgplane.config import settings_from_env

app = typer.Typer(
    name="pgplane",
    help="A self-hostable Postgres platform with a Neon-compatible management API.",
    no_args_is_help=True,
    add_completion=False,
)
api_keys_app = typer.Typer(
    help="Manage API keys directly on a data directory.", no_args_is_help=True
)
app.add_typer(api_keys_app, name="api-keys")

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where pgplane keeps its store and databases "
        "[default: $PGPLANE_DATA_DIR, else ~/.local/share/pgplane]",
        show_default=False,
    ),
]


def _logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


@app.command()
def serve(
    data_dir: DataDir = None,
    host: Annotated[str, typer.Option(help="Address the API listens on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port the API listens on (0: any free port)")] = 8080,
    compute_host: Annotated[
        str | None, typer.Option(help="Address computes listen on (the proxy reaches them there)")
    ] = None,
    proxy_port: Annotated[
        int | None, typer.Option(help="Port of the Postgres proxy (0: any free port) [5432]")
    ] = None,
    proxy_listen: Annotated[
        str | None, typer.Option(help="Address the Postgres proxy listens on [127.0.0.1]")
    ] = None,
    proxy_host: Annotated[
        str | None,
        typer.Option(help="Host name clients reach the proxy by; endpoints are ep-….<it>"),
    ] = None,
    proxy_wildcard_dns: Annotated[
        bool | None,
        typer.Option(help="ep-….<proxy-host> resolves: connection URIs use it (TLS SNI routing)"),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate for the proxy [generated once]")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM key of --tls-cert")] = None,
    compute_user: Annotated[
        str | None,
        typer.Option(
            help="As root: OS user of the Postgres templates (each project gets its own) [pgplane]"
        ),
    ] = None,
    rate_limit_per_minute: Annotated[
        int | None, typer.Option(help="Requests a minute per account; 0: no limit [700]")
    ] = None,
    rate_limit_burst_per_second: Annotated[
        int | None,
        typer.Option(help="Requests a second per account on one route; 0: no limit [40]"),
    ] = None,
    auth_failures_per_minute: Annotated[
        int | None,
        typer.Option(help="Failed authentications a minute per client address; 0: no limit [50]"),
    ] = None,
    projects_per_account: Annotated[
        int | None, typer.Option(help="Live projects an account may have; 0: no limit [0]")
    ] = None,
    branches_per_project: Annotated[
        int | None, typer.Option(help="Live branches a project may have; 0: no limit [5000]")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Run the API, the operations engine and the computes' supervisor in one process."""
    from pgplane.server import run  # noqa: PLC0415 - keep `api-keys` free of server imports

    _logging(log_level)
    settings = settings_from_env(
        data_dir=data_dir,
        host=host,
        port=port,
        compute_host=compute_host,
        compute_user=compute_user,
        proxy_port=proxy_port,
        proxy_listen=proxy_listen,
        proxy_host=proxy_host,
        proxy_wildcard_dns=proxy_wildcard_dns,
        tls_cert=tls_cert,
        tls_key=tls_key,
        rate_limit_per_minute=rate_limit_per_minute,
        rate_limit_burst_per_second=rate_limit_burst_per_second,
        auth_failures_per_minute=auth_failures_per_minute,
        projects_per_account=projects_per_account,
        branches_per_project=branches_per_project,
    )
    if (settings.tls_cert is None) != (settings.tls_key is None):
        typer.echo("error: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    run(settings)


@api_keys_app.command("create")
def api_keys_create(
    name: Annotated[str, typer.Option("--name", help="A name to recognise the key by")],
    account: Annotated[
        str, typer.Option("--account", help="Account e-mail; created if it does not exist")
    ] = "admin@localhost",
    data_dir: DataDir = None,
) -> None:
    """Create an API key (and its account if needed); print it once as JSON."""
    from pgplane.errors import PgplaneError  # noqa: PLC0415
    from pgplane.services import accounts, api_keys  # noqa: PLC0415
    from pgplane.store.sqlite import SqliteStore  # noqa: PLC0415

    settings = settings_from_env(data_dir=data_dir)

    async def create() -> dict[str, object]:
        store = SqliteStore(settings.store_path)
        try:
            async with store.write() as tx:
                owner = await accounts.ensure(tx, email=account)
                created = await api_keys.create(
                    tx, account_id=owner.id, name=name, created_by=owner.id
                )
        finally:
            await store.close()
        return {"id": created.key.id, "key": created.value, "name": created.key.name}

    try:
        result = asyncio.run(create())
    except PgplaneError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps(result))


def main() -> None:
    app()
