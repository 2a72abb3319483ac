"""Who may use the operations page, and the CSRF check of its forms.

* HTTP basic auth (``lattice ui --basic-auth USER:PASSWORD[,USER2:PASSWORD2]``
  or ``LATTICE_UI_BASIC_AUTH``), as for ``lattice flower``: every request
  without the right credentials gets ``401`` with a ``WWW-Authenticate``
  challenge. Passwords are compared in constant time. ``--unauthenticated``
  (loopback only, checked by the command) lets everyone in as ``anonymous``.
* CSRF: a signed double-submit cookie. Every page sets the cookie
  ``lattice_ui_csrf`` (random, ``HttpOnly``, ``SameSite=Strict``) when the
  browser has none; its forms carry ``csrf_token`` = HMAC-SHA256(a key of
  this process, cookie + user). A ``POST`` whose token does not match, or
  whose ``Origin`` is another site, gets ``403`` and changes nothing. Tokens
  die with the process (a page served before a restart needs a reload).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

CSRF_COOKIE = "lattice_ui_csrf"
"""The cookie of the CSRF check (see the module doc)."""

CSRF_FIELD = "csrf_token"
"""The form field that carries the CSRF token."""

ANONYMOUS = "anonymous"
"""Who an ``--unauthenticated`` page's user is, in the action log."""

REALM = "lattice ui"


def parse_basic_auth(value: str) -> dict[str, str]:
    """``USER:PASSWORD[,USER2:PASSWORD2...]`` as ``{user: password}``; raises
    ``ValueError`` (naming the user, never the password) for an entry with no
    user or no password."""
    users: dict[str, str] = {}
    for entry in value.split(","):
        user, sep, password = entry.partition(":")
        user = user.strip()
        if not sep or not user or not password:
            what = "an empty password" if sep else "no password"
            raise ValueError(
                "--basic-auth (LATTICE_UI_BASIC_AUTH) must be USER:PASSWORD, several separated by commas; "
                f"an entry for user {user!r} has {what}"
            )
        users[user] = password
    return users


@dataclass
class Auth:
    """The page's credentials (``users``: ``{user: password}``; empty = no
    credentials: every request is :data:`ANONYMOUS`) and this process's CSRF key."""

    users: dict[str, str] = field(default_factory=dict)
    key: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    def user_of(self, header: str | None) -> str | None:
        """The user an ``Authorization`` header authenticates, or ``None``."""
        if not self.users:
            return ANONYMOUS
        if not header or not header.lower().startswith("basic "):
            return None
        try:
            decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        user, _, password = decoded.partition(":")
        expected = self.users.get(user)
        # compared even for an unknown user, so timing does not tell which users exist
        ok = hmac.compare_digest(password.encode(), (expected if expected is not None else "\0").encode())
        return user if ok and expected is not None else None

    def csrf_token(self, cookie: str, user: str) -> str:
        """The token forms carry for ``cookie`` (the browser's CSRF cookie) and ``user``."""
        return hmac.new(self.key, f"{cookie}\0{user}".encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, cookie: str | None, user: str, token: str | None) -> bool:
        """Whether ``token`` is the one :meth:`csrf_token` gives for ``cookie`` and ``user``."""
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.csrf_token(cookie, user), token)


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether an ``Origin`` header (absent: yes) names the page's own ``host``."""
    if not origin:
        return True
    if origin == "null":
        return False
    return urlsplit(origin).netloc == (host or "")


class AuthMiddleware:
    """ASGI middleware: ``401`` without the right credentials (see the module
    doc); else the user goes on in ``scope["state"]["user"]``, and every
    response gets the CSRF cookie when the request had none (its value in
    ``scope["state"]["csrf_cookie"]`` for the page's forms)."""

    def __init__(self, app: ASGIApp, auth: Auth) -> None:
        self.app = app
        self.auth = auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        user = self.auth.user_of(conn.headers.get("authorization"))
        if user is None:
            response: Response = PlainTextResponse(
                "401 Unauthorized: this page needs the credentials of lattice ui --basic-auth\n",
                status_code=401,
                headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
            )
            await response(scope, receive, send)
            return
        cookie = conn.cookies.get(CSRF_COOKIE)
        fresh = None
        if not cookie or len(cookie) != 64:
            cookie = fresh = secrets.token_hex(32)
        state = scope.setdefault("state", {})
        state["user"] = user
        state["csrf_cookie"] = cookie

        async def send_with_cookie(message: dict) -> None:
            if message["type"] == "http.response.start" and fresh is not None:
                headers = list(message.get("headers", []))
                value = f"{CSRF_COOKIE}={fresh}; Path=/; HttpOnly; SameSite=Strict"
                headers.append((b"set-cookie", value.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_cookie)


__all__ = [
    "ANONYMOUS",
    "Auth",
    "AuthMiddleware",
    "CSRF_COOKIE",
    "CSRF_FIELD",
    "parse_basic_auth",
    "same_origin",
]
