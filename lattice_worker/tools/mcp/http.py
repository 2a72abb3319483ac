"""Streamable HTTP MCP servers: :func:`connect_mcp_streamable_http_server`.

Built on the SDK's ``streamable_http_client`` over an ``httpx2.AsyncClient``
this connection owns (``headers`` on every request, ``auth_provider`` as its
``auth``). Beyond :class:`~.connection.MCPConnection`:

* **sessions**: a server speaking the 2025 handshake gives the connection a
  session (``session_id``). When the server answers ``404`` for that session
  (it expired it, or restarted), the connection opens a new session once and
  sends the failed request again -- a 404 means the server did not run it.
  ``terminate_session()`` ends the session (HTTP ``DELETE``); the next call
  opens a new one. A server on the session-less 2026 protocol has no
  ``session_id`` (``None``).
* **OAuth**: pass an ``mcp.client.auth.OAuthClientProvider``. With a
  ``callback_handler`` of its own, the SDK completes the flow inside connect.
  Built *without* one, the connection supplies it: connect returns as soon as
  the provider needs the user (``authorization_url`` is set, ``tools`` is
  empty); send the user there and, once the authorization server redirected
  back with a code, ``await connection.finish_auth(code)`` completes the
  handshake and fills ``tools``.
* **refusals**: a server answering ``401`` / ``403`` fails the connect with an
  error saying it needs credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import AbstractAsyncContextManager
from typing import Any
from urllib.parse import parse_qs, urlparse

import httpx2
import mcp.types as mcp_types
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult
from mcp.shared.exceptions import MCPError

from ...errors import ConfigError
from ..mcp_servers import (
    DEFAULT_CALL_TIMEOUT_SECONDS,
    DEFAULT_CONNECT_TIMEOUT_SECONDS,
    check_headers,
    check_url,
)
from .connection import (
    MCPConnection,
    MCPConnectionError,
    _Connecting,
    _Generation,
    _positive,
    connect_failure,
)

logger = logging.getLogger("lattice_worker.mcp")

HTTP_TIMEOUT_SECONDS = 30.0
"""Connect / write / pool timeout of the connection's HTTP client, seconds."""

HTTP_READ_TIMEOUT_SECONDS = 300.0
"""Read timeout of the HTTP client (a server may hold a response stream open), seconds."""

TERMINATE_TIMEOUT_SECONDS = 5.0
"""Seconds the ``DELETE`` that ends a session may take (on ``terminate_session`` and ``close``)."""

_SESSION_HEADER = "mcp-session-id"
_VERSION_HEADER = "mcp-protocol-version"


class MCPStreamableHTTPConnection(MCPConnection):
    """A remote Streamable HTTP MCP server (see the module doc).

    Attributes (beyond :class:`~.connection.MCPConnection`): ``url``;
    ``authorization_url`` (where the user must go while an OAuth authorization
    is pending, else ``None``).
    """

    _kind = "MCP streamable HTTP"

    def __init__(
        self,
        url: str,
        *,
        name_prefix: str | None,
        headers: dict[str, str] | None,
        auth_provider: httpx2.Auth | None,
        connect_timeout: float,
        call_timeout: float,
    ) -> None:
        super().__init__(
            label=url, name_prefix=name_prefix, connect_timeout=connect_timeout, call_timeout=call_timeout
        )
        self.url = url
        self.authorization_url: str | None = None
        self._headers = dict(headers or {})
        self._auth = auth_provider
        self._http: httpx2.AsyncClient | None = None
        self._last_session_id: str | None = None
        self._expired: set[str] = set()
        self._refusal: tuple[int, str] | None = None
        self._auth_requested = asyncio.Event()
        self._auth_code: asyncio.Future[AuthorizationCodeResult] | None = None
        self._auth_state: str | None = None
        self._pending: tuple[_Generation, asyncio.Future[None]] | None = None
        if isinstance(auth_provider, OAuthClientProvider):
            self._supply_callback(auth_provider)

    # ------------------------------------------------------------ OAuth wiring

    def _supply_callback(self, provider: OAuthClientProvider) -> None:
        context = provider.context
        if context.callback_handler is not None:
            return  # the provider completes the flow itself
        user_redirect = context.redirect_handler

        async def redirect(url: str) -> None:
            self.authorization_url = url
            self._auth_state = (parse_qs(urlparse(url).query).get("state") or [None])[0]
            if user_redirect is not None:
                await user_redirect(url)

        async def callback() -> AuthorizationCodeResult:
            future: asyncio.Future[AuthorizationCodeResult] = asyncio.get_running_loop().create_future()
            self._auth_code = future
            self._auth_requested.set()
            return await future

        context.redirect_handler = redirect
        context.callback_handler = callback

    @property
    def auth_pending(self) -> bool:
        """True while the connection waits for :meth:`finish_auth`."""
        return self._pending is not None

    async def finish_auth(self, code: str, state: str | None = None) -> None:
        """Complete a pending OAuth authorization-code flow with the ``code`` the
        authorization server redirected the user back with (``state``: the
        redirect's ``state``, default the one the connection sent).

        Exchanges the code for tokens (through the provider, which stores them),
        completes the handshake and fills ``tools``. Raises
        :class:`MCPConnectionError` when no authorization is pending or the
        exchange / handshake fails, :class:`~.connection.MCPConnectTimeoutError`
        after ``connect_timeout`` seconds.
        """
        self._check_usable(allow_pending=True)
        if not isinstance(code, str) or not code:
            raise ConfigError(f"finish_auth: code must be a non-empty string, got {code!r}")
        future, pending = self._auth_code, self._pending
        if future is None or future.done() or pending is None:
            raise MCPConnectionError(
                f'no OAuth authorization is pending for MCP server "{self.server_name}"',
                server=self.server_name,
            )
        self._auth_requested.clear()
        future.set_result(AuthorizationCodeResult(code=code, state=state or self._auth_state))
        gen, ready = pending
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.shield(ready)
        except BaseException as exc:
            self._pending = None
            await self._stop(gen)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise connect_failure(self, exc) from None
        self._pending = None
        self.authorization_url = None
        self._ready(gen)
        self._gen = gen
        if not self.tools:
            await self._load_tools()

    async def _await_ready(self, ready: asyncio.Future[None]) -> bool:
        waiter = asyncio.ensure_future(self._auth_requested.wait())
        try:
            async with asyncio.timeout(self.connect_timeout):
                await asyncio.wait({ready, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if ready.done():
            ready.result()  # raises the connect failure
            return True
        return False

    def _on_pending(self, gen: _Generation, ready: asyncio.Future[None]) -> None:
        self._pending = (gen, ready)
        logger.info('MCP server "%s" needs OAuth authorization: %s', self.server_name, self.authorization_url)

    # ------------------------------------------------------------ transport

    def _client(self) -> httpx2.AsyncClient:
        if self._http is None:
            self._http = httpx2.AsyncClient(
                headers=self._headers,
                auth=self._auth,
                timeout=httpx2.Timeout(HTTP_TIMEOUT_SECONDS, read=HTTP_READ_TIMEOUT_SECONDS),
                event_hooks={"response": [self._on_response]},
            )
        return self._http

    async def _on_response(self, response: httpx2.Response) -> None:
        sent = response.request.headers.get(_SESSION_HEADER)
        status = response.status_code
        if status == 404 and sent:
            self._expired.add(sent)
        elif status < 400:
            received = response.headers.get(_SESSION_HEADER)
            if received:
                self._last_session_id = received
        if status in (401, 403):
            self._refusal = (status, response.headers.get("www-authenticate", ""))

    def _transport(self, gen: _Generation) -> AbstractAsyncContextManager[Any]:
        self._last_session_id = None
        return streamable_http_client(self.url, http_client=self._client(), terminate_on_close=False)

    def _after_ready(self, gen: _Generation) -> None:
        gen.session_id = self._last_session_id
        self._refusal = None

    def _describe_failure(self, exc: BaseException) -> str:
        if self._refusal is not None:
            status, challenge = self._refusal
            what = "401 Unauthorized" if status == 401 else "403 Forbidden"
            hint = (
                "the credentials given were not accepted"
                if self._auth is not None or any(k.lower() == "authorization" for k in self._headers)
                else "pass auth_provider=OAuthClientProvider(...) or an Authorization header in headers="
            )
            extra = f" (WWW-Authenticate: {challenge})" if challenge else ""
            return f"the server answered HTTP {what}: it requires authorization; {hint}{extra}"
        if isinstance(exc, httpx2.TransportError):
            return f"cannot reach {self.url}: {type(exc).__name__}: {exc}"
        return super()._describe_failure(exc)

    # ------------------------------------------------------------ sessions

    @property
    def session_id(self) -> str | None:
        """The current MCP session id, or ``None`` (no session: not connected, or a
        session-less server)."""
        gen = self._gen
        return gen.session_id if gen is not None and not gen.dead else None

    def _needs_reopen(self, gen: _Generation | None) -> bool:
        if super()._needs_reopen(gen):
            return True
        assert gen is not None
        return gen.session_id is not None and gen.session_id in self._expired

    def _should_retry(self, gen: _Generation, exc: MCPError) -> bool:
        return (
            exc.code == mcp_types.INVALID_REQUEST
            and gen.session_id is not None
            and gen.session_id in self._expired
        )

    async def _delete_session(self, gen: _Generation) -> int | None:
        sid = gen.session_id
        if sid is None or sid in self._expired:
            return None
        headers = {_SESSION_HEADER: sid}
        version = gen.client.protocol_version if gen.client is not None else None
        if version:
            headers[_VERSION_HEADER] = version
        try:
            async with asyncio.timeout(TERMINATE_TIMEOUT_SECONDS):
                response = await self._client().delete(self.url, headers=headers)
        except Exception as exc:  # noqa: BLE001 - ending a session is best-effort
            logger.info('MCP server "%s": ending session %s failed: %r', self.server_name, sid, exc)
            return None
        if response.status_code != 405:
            self._expired.add(sid)
        return response.status_code

    async def terminate_session(self) -> bool:
        """End the current MCP session (HTTP ``DELETE``). Returns True when the
        server ended it, False when there is no session or the server does not
        allow ending it (``405``). After True the next call opens a new session."""
        self._check_usable()
        gen = self._gen
        if gen is None or gen.session_id is None:
            return False
        async with self._lock:
            status = await self._delete_session(gen)
            if status is None or status == 405:
                return False
            await self._stop(gen)
        return status in (200, 202, 204)

    async def _before_close(self, gen: _Generation) -> None:
        if not gen.dead:
            await self._delete_session(gen)

    async def _after_close(self) -> None:
        future = self._auth_code
        if future is not None and not future.done():
            future.cancel()
        pending, self._pending = self._pending, None
        if pending is not None:
            await self._stop(pending[0])
        if self._http is not None:
            with contextlib.suppress(Exception):
                await self._http.aclose()
            self._http = None


def connect_mcp_streamable_http_server(
    url: str,
    *,
    name_prefix: str | None = None,
    headers: dict[str, str] | None = None,
    auth_provider: httpx2.Auth | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
) -> _Connecting[MCPStreamableHTTPConnection]:
    """Connect a Streamable HTTP MCP server and map its tools (``await`` it, or
    ``async with`` it).

    ``url``: the MCP endpoint (``http://`` or ``https://``). ``headers``: sent on
    every request (for example ``{"Authorization": "Bearer ..."}``).
    ``auth_provider``: an ``mcp.client.auth.OAuthClientProvider`` (or any
    ``httpx2.Auth``); see the module doc for ``finish_auth``. ``name_prefix``:
    joined to every tool name. ``connect_timeout`` / ``call_timeout``: seconds.

    Returns an :class:`MCPStreamableHTTPConnection`. Raises :class:`ConfigError`
    for bad arguments (at once); :class:`~.connection.MCPConnectTimeoutError`
    when the handshake does not complete in time; :class:`MCPConnectionError`
    when the server cannot be reached, refuses the client (401/403: the message
    says it needs credentials) or its tool listing fails.
    """
    where = "connect_mcp_streamable_http_server"
    try:
        check_url(where, url)
        check_headers(where, headers)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if auth_provider is not None and not isinstance(auth_provider, httpx2.Auth):
        raise ConfigError(
            f"{where}: auth_provider must be an mcp.client.auth.OAuthClientProvider (an httpx2.Auth), "
            f"got {type(auth_provider).__name__}"
        )
    if name_prefix is not None and not isinstance(name_prefix, str):
        raise ConfigError(f"{where}: name_prefix must be a string, got {type(name_prefix).__name__}")
    connection = MCPStreamableHTTPConnection(
        url,
        name_prefix=name_prefix,
        headers=headers,
        auth_provider=auth_provider,
        connect_timeout=_positive(where, "connect_timeout", connect_timeout),
        call_timeout=_positive(where, "call_timeout", call_timeout),
    )
    return _Connecting(connection)


__all__ = ["MCPStreamableHTTPConnection", "connect_mcp_streamable_http_server"]
