"""Bearer authentication: the dependency every route takes as ``caller``."""

from __future__ import annotations

from dataclasses import dataclass

from litestar import Request
from litestar.datastructures import State

from pgplane.errors import Unauthorized
from pgplane.services import api_keys
from pgplane.store import Store


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is asking: the account every lookup is scoped to, and the key it used."""

    account_id: str
    key_id: int


async def current_caller(request: Request[object, object, State], store: Store) -> Caller:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized()
    async with store.read() as tx:
        key = await api_keys.authenticate(tx, value=token.strip())
    if key is None:
        raise Unauthorized()
    recorder: api_keys.UseRecorder = request.app.state.key_uses
    recorder.record(key.id, request.client.host if request.client else "")
    return Caller(account_id=key.account_id, key_id=key.id)
