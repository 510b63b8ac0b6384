"""``/api_keys``: create (the value is shown once), list, revoke."""

from __future__ import annotations

from litestar import Controller, delete, get, post

from pgplane.api import presenters
from pgplane.api.auth import Caller
from pgplane.api.deps import error_responses
from pgplane.api.schemas import ApiKeyCreated, ApiKeyCreateRequest, ApiKeyListItem, ApiKeyRevoked
from pgplane.services import api_keys
from pgplane.store import Store


class ApiKeys(Controller):
    path = "/api_keys"
    tags = ["API Key"]  # noqa: RUF012 - Litestar reads it as an instance attribute

    @post(status_code=200, operation_id="createApiKey", responses=error_responses())
    async def create(
        self, caller: Caller, store: Store, data: ApiKeyCreateRequest
    ) -> ApiKeyCreated:
        """Create an API key; its value is returned now and never again."""
        async with store.write() as tx:
            created = await api_keys.create(
                tx, account_id=caller.account_id, name=data.key_name, created_by=caller.account_id
            )
        return presenters.api_key_created(created.key, created.value)

    @get(operation_id="listApiKeys", responses=error_responses())
    async def list_(self, caller: Caller, store: Store) -> list[ApiKeyListItem]:
        """The account's keys that are not revoked, newest first."""
        async with store.read() as tx:
            keys = await api_keys.list_(tx, account_id=caller.account_id)
            account = await tx.get_account(caller.account_id)
        name = account.name if account else ""
        return [presenters.api_key_item(k, name) for k in keys]

    @delete(
        "/{key_id:int}", status_code=200, operation_id="revokeApiKey", responses=error_responses()
    )
    async def revoke(self, caller: Caller, store: Store, key_id: int) -> ApiKeyRevoked:
        """Revoke a key: immediate and irreversible."""
        async with store.write() as tx:
            key = await api_keys.revoke(tx, account_id=caller.account_id, key_id=key_id)
        return presenters.api_key_revoked(key)
