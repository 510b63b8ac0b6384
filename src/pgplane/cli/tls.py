"""``pgplane tls``: the proxy's TLS, for clients to trust."""

from __future__ import annotations

from typing import Annotated

import typer

from pgplane.cli.common import DataDir, platform_dir
from pgplane.config import settings_from_env

tls_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="The proxy's TLS: the platform's certificate authority, for clients to trust.",
    no_args_is_help=True,
)


@tls_app.command("ca-cert")
def tls_ca_cert(
    path: Annotated[
        bool, typer.Option("--path", help="Print where the certificate is, not the certificate")
    ] = False,
    data_dir: DataDir = None,
) -> None:
    """Print the platform's CA certificate (PEM), which clients trust to verify the proxy:
    sslrootcert= (libpq: psql, psycopg), NODE_EXTRA_CA_CERTS (node), or a system trust store."""
    from pgplane.tls import ca_certificate  # noqa: PLC0415

    settings = settings_from_env(data_dir=platform_dir(data_dir))
    where = ca_certificate(settings.tls_dir)
    try:
        pem = where.read_text()
    except FileNotFoundError:
        typer.echo(
            f"error: no certificate authority at {where}: `pgplane serve` makes it on its first"
            " start (not when the proxy has a --tls-cert of its own)",
            err=True,
        )
        raise typer.Exit(2) from None
    except PermissionError:
        typer.echo(f"error: {where} can be read by the platform's user only", err=True)
        raise typer.Exit(2) from None
    typer.echo(str(where) if path else pem, nl=path)
