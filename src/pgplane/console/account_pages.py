"""Sign-up, sign-in, sign-out, and Account settings → API keys."""

from __future__ import annotations

from typing import Any

from litestar import Controller, get, post
from litestar.params import FromPath, FromQuery
from litestar.response import Redirect, Template

from pgplane.console.pages import form, page
from pgplane.console.session import (
    FORM_COOKIE,
    PREFIX,
    SESSION_COOKIE,
    AnyRequest,
    Console,
    client_address,
    cookie,
    form_token,
    maybe_signed_in,
    signed_in,
    with_cookies,
)
from pgplane.errors import BadRequest, Conflict, Unauthorized
from pgplane.services import api_keys, signin


def _console(request: AnyRequest) -> Console:
    found: Console = request.app.state["console"]
    return found


def _signed_in_response(request: AnyRequest, token: str) -> Redirect:
    # The pre-session's token is spent: a form of it posted again is refused.
    _console(request).pre_sessions.end(request.cookies.get(FORM_COOKIE, ""))
    response = Redirect(path=f"{PREFIX}/projects", status_code=303)
    response.set_cookie(cookie(request, SESSION_COOKIE, token, max_age=signin.SESSION_SECONDS))
    response.delete_cookie(FORM_COOKIE, path=PREFIX)
    return response


def _public_form(request: AnyRequest, name: str, status: int = 200, **context: Any) -> Template:
    token, fresh = form_token(request, _console(request).pre_sessions)
    response = page(request, name, status_code=status, csrf=token, **context)
    with_cookies(response, [fresh])
    return response


class Auth(Controller):
    path = PREFIX

    @get("/signin")
    async def signin_form(self, request: AnyRequest) -> Any:
        if maybe_signed_in(request) is not None:
            return Redirect(path=f"{PREFIX}/projects")
        return _public_form(request, "signin.html")

    @post("/signin")
    async def signin(self, request: AnyRequest) -> Any:
        fields = await form(request)
        address = fields.get("email", "").strip().lower()
        console = _console(request)
        where = client_address(request)
        console.throttle.check(where, address)
        async with console.store.read() as tx:
            account, password_hash = await signin.account_for_sign_in(tx, address)
        # Verified even without an account, so that the answer takes as long either way.
        ok = await signin.password_matches(password_hash, fields.get("password", ""))
        if account is None or not ok:
            console.throttle.failed(where, address)
            return _public_form(
                request, "signin.html", 401, error="wrong email or password", email=address
            )
        before = maybe_signed_in(request)
        async with console.store.write() as tx:
            if before is not None:  # signing in again replaces the session, never adds to it
                await signin.end_session(tx, before.session)
            new = await signin.start_session(tx, account_id=account.id)
        return _signed_in_response(request, new.token)

    @get("/signup")
    async def signup_form(self, request: AnyRequest, token: FromQuery[str] = "") -> Any:
        token = token[:128]
        # A link used or expired says so at once, not after its form was filled in.
        try:
            async with _console(request).store.read() as tx:
                await signin.check_signup_link(tx, token=token)
        except Unauthorized as exc:
            return _public_form(request, "signup.html", exc.status, error=exc.message, token=token)
        return _public_form(request, "signup.html", token=token)

    @post("/signup")
    async def signup(self, request: AnyRequest) -> Any:
        fields = await form(request)
        token, address = fields.get("token", ""), fields.get("email", "")
        console = _console(request)
        try:
            password_hash = await signin.hash_password(fields.get("password", ""))
            async with console.store.write() as tx:
                account = await signin.sign_up(
                    tx, token=token, address=address, password_hash=password_hash
                )
                new = await signin.start_session(tx, account_id=account.id)
        except (BadRequest, Conflict, Unauthorized) as exc:
            return _public_form(
                request,
                "signup.html",
                exc.status,
                error=exc.message,
                token=token[:128],
                email=address[:254],
            )
        return _signed_in_response(request, new.token)

    @post("/signout")
    async def signout(self, request: AnyRequest) -> Redirect:
        me = signed_in(request)
        fields = await form(request)
        async with me.console.store.write() as tx:
            await signin.end_session(tx, me.session, everywhere=fields.get("everywhere") == "1")
        response = Redirect(path=f"{PREFIX}/signin", status_code=303)
        response.delete_cookie(SESSION_COOKIE, path=PREFIX)
        return response


class ApiKeysPage(Controller):
    path = f"{PREFIX}/settings/api-keys"

    @get("/")
    async def list_(self, request: AnyRequest) -> Template:
        return await _keys_page(request)

    @post("/")
    async def create(self, request: AnyRequest) -> Template:
        me = signed_in(request)
        fields = await form(request)
        try:
            async with me.console.store.write() as tx:
                created = await api_keys.create(
                    tx,
                    account_id=me.account_id,
                    name=fields.get("name", ""),
                    created_by=me.account_id,
                )
        except BadRequest as exc:
            return await _keys_page(request, status=400, error=exc.message)
        return await _keys_page(request, created=created, status=201)

    @post("/{key_id:int}/revoke")
    async def revoke(self, request: AnyRequest, key_id: FromPath[int]) -> Redirect:
        me = signed_in(request)
        async with me.console.store.write() as tx:
            await api_keys.revoke(tx, account_id=me.account_id, key_id=key_id)
        return Redirect(path=f"{PREFIX}/settings/api-keys", status_code=303)


async def _keys_page(request: AnyRequest, status: int = 200, **context: Any) -> Template:
    me = signed_in(request)
    async with me.console.store.read() as tx:
        keys = await api_keys.list_(tx, account_id=me.account_id)
    return page(request, "api_keys.html", status_code=status, keys=keys, **context)
