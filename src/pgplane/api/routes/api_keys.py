"""``/api_keys``: create (the value is shown once), list, revoke."""

from __future__ import annotations

from litestar import Controller, delete, get, post
from litestar.params import FromPath, JSONBody

from pgplane.api import presenters
from pgplane.api.auth import AnyRequest, authorized
from pgplane.api.responses import error_responses
from pgplane.api.schemas import ApiKeyCreated, ApiKeyCreateRequest, ApiKeyListItem, ApiKeyRevoked
from pgplane.services import api_keys


class ApiKeys(Controller):
    path = "/api_keys"
    tags = ["API Key"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @post(status_code=200, operation_id="createApiKey", responses=error_responses(body=True))
    async def create(
        self, request: AnyRequest, data: JSONBody[ApiKeyCreateRequest]
    ) -> ApiKeyCreated:
        """Create an API key; its value is returned now and never again."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            created = await api_keys.create(
                tx, account_id=ctx.account_id, name=data.key_name, created_by=ctx.account_id
            )
        return presenters.api_key_created(created.key, created.value)

    @get(operation_id="listApiKeys", responses=error_responses())
    async def list_(self, request: AnyRequest) -> list[ApiKeyListItem]:
        """The account's keys that are not revoked, newest first."""
        ctx = authorized(request)
        async with ctx.store.read() as tx:
            keys = await api_keys.list_(tx, account_id=ctx.account_id)
            account = await tx.get_account(ctx.account_id)
        name = account.name if account else ""
        return [presenters.api_key_item(k, name) for k in keys]

    @delete(
        "/{key_id:int}", status_code=200, operation_id="revokeApiKey", responses=error_responses()
    )
    async def revoke(self, request: AnyRequest, key_id: FromPath[int]) -> ApiKeyRevoked:
        """Revoke a key: immediate and irreversible."""
        ctx = authorized(request)
        async with ctx.store.write() as tx:
            key = await api_keys.revoke(tx, account_id=ctx.account_id, key_id=key_id)
        return presenters.api_key_revoked(key)
