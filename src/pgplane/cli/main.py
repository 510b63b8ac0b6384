"""``pgplane``: the command line. ``serve`` is here; the rest, a module each (api-keys,
accounts, tls, store, psql)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pgplane.cli.accounts import accounts_app
from pgplane.cli.backups import backups_app
from pgplane.cli.common import DataDir
from pgplane.cli.keys import api_keys_app
from pgplane.cli.nodes import nodes_app
from pgplane.cli.psql import psql_command
from pgplane.cli.recover import ArchiveKeyOption, ObjectStoreOption, recover_command
from pgplane.cli.store import store_app
from pgplane.cli.tls import tls_app
from pgplane.config import settings_from_env
from pgplane.core.nodes import check_name
from pgplane.telemetry import logs

app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    name="pgplane",
    help="A self-hostable Postgres platform with a Neon-compatible management API.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(api_keys_app, name="api-keys")
app.add_typer(accounts_app, name="accounts")
app.add_typer(tls_app, name="tls")
app.add_typer(store_app, name="store")
app.add_typer(nodes_app, name="nodes")
app.add_typer(backups_app, name="backups")
app.command("recover")(recover_command)
app.command("psql")(psql_command)


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
    archive_sync: Annotated[
        bool | None,
        typer.Option(
            "--archive-sync",
            help="With --object-store: a commit is acknowledged only once its WAL is in the"
            " object store (nothing acknowledged is lost with the machine; commits wait while"
            " the store does not answer); default: $PGPLANE_ARCHIVE_SYNC, else off",
            show_default=False,
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(help="text, or json: one object a line with the ids in context [text]"),
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error")] = "info",
    node_name: Annotated[
        str | None,
        typer.Option(
            help="This node's name among those sharing the store; default: $PGPLANE_NODE_NAME,"
            " else the host's name and a hash of the data directory",
            show_default=False,
        ),
    ] = None,
    node_listen: Annotated[
        str | None,
        typer.Option(
            help="Address the node door (other nodes' way in) listens on [--proxy-listen]"
        ),
    ] = None,
    node_port: Annotated[
        int | None, typer.Option(help="Port of the node door (0: any free port) [0]")
    ] = None,
    node_advertise: Annotated[
        str | None,
        typer.Option(help="Host or address other nodes dial the node door at [--node-listen]"),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="postgresql://user@host/db URL of a PostgreSQL store (several serve processes"
            " share it); default: $PGPLANE_STORE, else SQLite in the data directory",
            show_default=False,
        ),
    ] = None,
    shared_dir: Annotated[
        Path | None,
        typer.Option(
            help="A directory on storage every node reaches (NFS): the cold archive and the"
            " branches' history go there, so projects can move between nodes;"
            " default: $PGPLANE_SHARED_DIR, else none",
            show_default=False,
        ),
    ] = None,
    object_store: ObjectStoreOption = None,
    archive_key_file: ArchiveKeyOption = None,
) -> None:
    """Run the API, the operations engine and the computes' supervisor in one process."""
    from pgplane.server import run  # noqa: PLC0415 - keep `api-keys` free of server imports

    try:
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
            store=store,
            node_name=node_name,
            node_listen=node_listen,
            node_port=node_port,
            node_advertise=node_advertise,
            shared_dir=shared_dir,
            object_store=object_store,
            archive_key_file=archive_key_file,
            archive_sync=archive_sync,
        )
        if settings.node_name is not None:
            check_name(settings.node_name)
        logs.configure(log_level, settings.log_format)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if (settings.tls_cert is None) != (settings.tls_key is None):
        typer.echo("error: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    from pgplane.preflight import Unusable, check_paths  # noqa: PLC0415

    try:
        check_paths(settings)  # before anything is made
    except Unusable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    run(settings)


def main() -> None:
    app()
