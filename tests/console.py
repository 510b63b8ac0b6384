"""A console client for tests: an HTTP client with a cookie jar that reads the CSRF token of the
page it last loaded and sends it with its forms, as a browser does."""

from __future__ import annotations

import re
from typing import Any

import httpx

from tests.support import Server, wait_for

_CSRF = re.compile(r'name="csrf_token" value="([^"]*)"')
_LINK = re.compile(r"(http://\S+/console/signup\?token=\S+)")
PASSWORD = "correct horse battery staple"


def root(server: Server) -> str:
    return server.base_url.removesuffix("/api/v2")


def signup_link(server: Server) -> str:
    """The one-time link ``serve`` printed for the first account."""
    found = wait_for("the sign-up link in the log", lambda: _LINK.search(server.log()))
    return str(found.group(1))


class Browser:
    def __init__(self, server: Server) -> None:
        self.server = server
        self.http = httpx.Client(base_url=root(server), follow_redirects=False, timeout=30)
        self.csrf = ""

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        r = self.http.get(path, **kwargs)
        found = _CSRF.search(r.text)
        if found:
            self.csrf = found.group(1)
        return r

    def post(
        self,
        path: str,
        csrf: str | None = None,
        *,
        headers: dict[str, str] | None = None,
        **fields: str,
    ) -> httpx.Response:
        """Post a form with the page's CSRF token (or ``csrf``: "" sends none)."""
        token = self.csrf if csrf is None else csrf
        data = {**fields, **({"csrf_token": token} if token else {})}
        r = self.http.post(path, data=data, headers=headers)
        found = _CSRF.search(r.text)
        if found:
            self.csrf = found.group(1)
        return r

    def sign_up(self, link: str, email: str, password: str = PASSWORD) -> httpx.Response:
        self.get(link.removeprefix(root(self.server)))
        token = link.split("token=", 1)[1]
        return self.post("/console/signup", token=token, email=email, password=password)

    def sign_in(self, email: str, password: str = PASSWORD) -> httpx.Response:
        self.get("/console/signin")
        return self.post("/console/signin", email=email, password=password)

    @property
    def session(self) -> str | None:
        return self.http.cookies.get("pgplane_session")

    def create_key(self, name: str) -> str:
        self.get("/console/settings/api-keys/")
        r = self.post("/console/settings/api-keys/", name=name)
        assert r.status_code == 201, r.text
        found = re.search(r'id="new-key">([^<]+)<', r.text)
        assert found is not None, r.text
        return found.group(1)
