"""``pgplane api-keys``: an account's API keys, straight on a data directory (headless)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from pgplane.cli.common import DataDir, in_store

if TYPE_CHECKING:
    from pgplane.core.models import Account
    from pgplane.store import Tx

api_keys_app = typer.Typer(
    rich_markup_mode=None,  # plain help: readable at 80 columns, nothing to escape
    help="Manage API keys directly on a data directory.",
    no_args_is_help=True,
)

AccountOption = Annotated[
    str | None,
    typer.Option(
        "--account",
        help="The account's e-mail, the one that signs in to the console [the only account]",
        show_default=False,
    ),
]


async def _owner(tx: Tx, email: str | None, *, create: bool) -> Account:
    """The account named, or the platform's only one; made (``create``) when the platform has
    none, or the e-mail names none."""
    from pgplane.errors import BadRequest, NotFound  # noqa: PLC0415
    from pgplane.services import accounts  # noqa: PLC0415

    if email is None:
        found = [account for account, _ in await tx.list_accounts()]
        if len(found) > 1:
            raise BadRequest(
                "there are several accounts: name one with --account (pgplane accounts list)"
            )
        if found:
            return found[0]
        email = accounts.HEADLESS  # taken over by the first to sign up in the console
    owner = await tx.get_account_by_email(email)
    if owner is None and create:
        owner = await accounts.ensure(tx, email=email)
    if owner is None:
        raise NotFound(f"no account {email}")
    return owner


@api_keys_app.command("create")
def api_keys_create(
    name: Annotated[str, typer.Option("--name", help="A name to recognise the key by")],
    account: AccountOption = None,
    data_dir: DataDir = None,
) -> None:
    """Create an API key for an account (made if new); print it once as JSON. Its projects
    show in the console to whoever signs in as that account."""
    from pgplane.services import api_keys  # noqa: PLC0415

    async def create(tx: Tx) -> dict[str, object]:
        owner = await _owner(tx, account, create=True)
        created = await api_keys.create(tx, account_id=owner.id, name=name, created_by=owner.id)
        return {"id": created.key.id, "key": created.value, "name": created.key.name}

    result = in_store(data_dir, create)
    typer.echo(json.dumps(result))


@api_keys_app.command("list")
def api_keys_list(account: AccountOption = None, data_dir: DataDir = None) -> None:
    """List the account's keys (never their values) as JSON, as GET /api_keys does."""
    import msgspec  # noqa: PLC0415

    from pgplane.api import presenters  # noqa: PLC0415
    from pgplane.services import api_keys  # noqa: PLC0415

    async def listed(tx: Tx) -> list[object]:
        owner = await _owner(tx, account, create=False)
        keys = await api_keys.list_(tx, account_id=owner.id)
        return [msgspec.to_builtins(presenters.api_key_item(k, owner.name)) for k in keys]

    typer.echo(json.dumps(in_store(data_dir, listed), indent=2))


@api_keys_app.command("revoke")
def api_keys_revoke(
    key_id: Annotated[int, typer.Argument(help="The key's id (api-keys list shows it)")],
    account: AccountOption = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke one of the account's keys; it stops working at once, as DELETE /api_keys/{id}."""
    from pgplane.services import api_keys  # noqa: PLC0415

    async def revoke(tx: Tx) -> dict[str, int]:
        owner = await _owner(tx, account, create=False)
        return {"id": (await api_keys.revoke(tx, account_id=owner.id, key_id=key_id)).id}

    typer.echo(json.dumps({**in_store(data_dir, revoke), "revoked": True}))
