"""``pgplane accounts``: console accounts, for headless installs."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from pgplane.cli.common import DataDir, in_store, log, platform_dir, say_progress
from pgplane.telemetry import progress

if TYPE_CHECKING:
    from pgplane.store import Tx

accounts_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="Console accounts, for headless installs (the console's own sign-up needs a link).",
    no_args_is_help=True,
)


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
    say_progress()

    async def hashed() -> str:
        with progress.step(log, "hashing the password"):
            return await signin.hash_password(password)

    try:
        password_hash = asyncio.run(hashed())
    except BadRequest as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(2) from None

    async def create(tx: Tx) -> str:
        account = await signin.set_password(tx, address=email, password_hash=password_hash)
        return account.email

    typer.echo(json.dumps({"email": in_store(data_dir, create)}))


@accounts_app.command("invite")
def accounts_invite(
    email: Annotated[str, typer.Argument(help="Who the invitation is for")],
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The console's address, as the invited person reaches it [where serve last"
            " served it]",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDir = None,
) -> None:
    """Print a one-time sign-up link for ``email`` (valid for 7 days)."""
    from pgplane.config import settings_from_env  # noqa: PLC0415
    from pgplane.services import signin  # noqa: PLC0415

    data_dir = platform_dir(data_dir)
    if url is None:
        served = settings_from_env(data_dir=data_dir).console_url_path
        try:
            url = served.read_text().strip()
        except OSError:
            url = "http://127.0.0.1:8080/console"  # serve's default address

    async def invite(tx: Tx) -> str:
        return await signin.new_signup_link(tx, for_email=email)

    token = in_store(data_dir, invite)
    typer.echo(f"{url.rstrip('/')}/signup?token={token}")


@accounts_app.command("list")
def accounts_list(data_dir: DataDir = None) -> None:
    """List the accounts (e-mail, whether it signs in to the console, when made) as JSON."""
    from pgplane.core import clock  # noqa: PLC0415

    async def listed(tx: Tx) -> list[dict[str, object]]:
        return [
            {
                "email": account.email,
                "console_sign_in": has_password,
                "created_at": clock.format_s(account.created_at),
            }
            for account, has_password in await tx.list_accounts()
        ]

    typer.echo(json.dumps(in_store(data_dir, listed), indent=2))
