"""``pgplane serve``, ``pgplane api-keys create`` and ``pgplane accounts create/invite``."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from pgplane.config import settings_from_env
from pgplane.telemetry import logs

if TYPE_CHECKING:
    from pgplane.store import Tx

T = TypeVar("T")

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
accounts_app = typer.Typer(
    help="Console accounts, for headless installs (the console's own sign-up needs a link).",
    no_args_is_help=True,
)
app.add_typer(accounts_app, name="accounts")

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="Where pgplane keeps its store and databases "
        "[default: $PGPLANE_DATA_DIR, else ~/.local/share/pgplane]",
        show_default=False,
    ),
]


def _version(show: bool) -> None:
    if show:
        from importlib.metadata import version  # noqa: PLC0415

        typer.echo(f"pgplane {version('pgplane')}")
        raise typer.Exit


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """A self-hostable Postgres platform with a Neon-compatible management API."""


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
        int | None, typer.Option(help="Live projects an account may have; 0: no limit [20]")
    ] = None,
    branches_per_project: Annotated[
        int | None, typer.Option(help="Live branches a project may have; 0: no limit [5000]")
    ] = None,
    running_computes_per_account: Annotated[
        int | None,
        typer.Option(help="Computes an account may run at once; 0: no limit [20]"),
    ] = None,
    compute_units_per_account: Annotated[
        float | None,
        typer.Option(help="Sum of the max CU of an account's running computes; 0: no limit [32]"),
    ] = None,
    min_pg_version: Annotated[
        int | None,
        typer.Option(
            help="Oldest Postgres major for new projects (15 and older hand CREATEROLE the"
            " compute's OS user); existing projects keep theirs; 0: any [0]"
        ),
    ] = None,
    disk_per_project: Annotated[
        int | None,
        typer.Option(
            help="As root: each project's disk share (data, WAL, history), a filesystem of its"
            " own; 0: none [16384]"
        ),
    ] = None,
    branch_size_limit: Annotated[
        int | None,
        typer.Option(
            help="MiB a branch's data may reach before writes that add data fail"
            " (SQLSTATE 53100, as on Neon); 0: no limit [3072]"
        ),
    ] = None,
    stop_computes: Annotated[
        bool | None,
        typer.Option(
            "--stop-computes",
            help="On SIGINT/SIGTERM, suspend every running compute before stopping (recorded"
            " as operations); without it they keep running and the next start adopts them",
        ),
    ] = None,
    metrics: Annotated[
        bool | None,
        typer.Option("--metrics/--no-metrics", help="GET /metrics on the API's port [on]"),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(help="text, or json: one object a line with the ids in context [text]"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
) -> None:
    """Run the API, the operations engine and the computes' supervisor in one process."""
    from pgplane.server import run  # noqa: PLC0415 - keep `api-keys` free of server imports

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
        running_computes_per_account=running_computes_per_account,
        compute_units_per_account=compute_units_per_account,
        min_pg_version=min_pg_version,
        disk_per_project=disk_per_project,
        branch_size_limit=branch_size_limit,
        stop_computes=stop_computes,
        metrics=metrics,
        log_format=log_format,
    )
    try:
        logs.configure(log_level, settings.log_format)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
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
    from pgplane.services import accounts, api_keys  # noqa: PLC0415

    async def create(tx: Tx) -> dict[str, object]:
        owner = await accounts.ensure(tx, email=account)
        created = await api_keys.create(tx, account_id=owner.id, name=name, created_by=owner.id)
        return {"id": created.key.id, "key": created.value, "name": created.key.name}

    result = _in_store(data_dir, create)
    typer.echo(json.dumps(result))


def _in_store(data_dir: Path | None, work: Callable[[Tx], Awaitable[T]]) -> T:
    """Run ``work`` in one write transaction on the data directory's store; exit 2 with the
    message on a platform error."""
    from pgplane.errors import PgplaneError  # noqa: PLC0415
    from pgplane.store.sqlite import SqliteStore  # noqa: PLC0415

    settings = settings_from_env(data_dir=data_dir)

    async def run() -> T:
        store = SqliteStore(settings.store_path)
        try:
            async with store.write() as tx:
                return await work(tx)
        finally:
            await store.close()

    try:
        return asyncio.run(run())
    except PgplaneError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None


@accounts_app.command("create")
def accounts_create(
    email: Annotated[str, typer.Argument(help="The account's e-mail, its sign-in name")],
    password_stdin: Annotated[
        bool, typer.Option("--password-stdin", help="Read the password from standard input")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """Create an account that signs in to the console (or set an existing one's password)."""
    from pgplane.errors import BadRequest  # noqa: PLC0415
    from pgplane.services import signin  # noqa: PLC0415

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    try:
        password_hash = asyncio.run(signin.hash_password(password))
    except BadRequest as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None

    async def create(tx: Tx) -> str:
        account = await signin.set_password(tx, address=email, password_hash=password_hash)
        return account.email

    typer.echo(json.dumps({"email": _in_store(data_dir, create)}))


@accounts_app.command("invite")
def accounts_invite(
    email: Annotated[str, typer.Argument(help="Who the invitation is for")],
    url: Annotated[
        str, typer.Option("--url", help="The console's address, as the invited person reaches it")
    ] = "http://127.0.0.1:8080/console",
    data_dir: DataDir = None,
) -> None:
    """Print a one-time sign-up link for ``email`` (valid for 7 days)."""
    from pgplane.services import signin  # noqa: PLC0415

    async def invite(tx: Tx) -> str:
        return await signin.new_signup_link(tx, for_email=email)

    token = _in_store(data_dir, invite)
    typer.echo(f"{url.rstrip('/')}/signup?token={token}")


def main() -> None:
    app()
