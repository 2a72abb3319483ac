"""A Streamable HTTP MCP server for the tests (the ``mcp`` SDK's ``MCPServer`` on uvicorn).

Run: ``python tests/support/mcp_http_server.py --port PORT [--legacy] [--oauth]``;
the tests wait until the port accepts connections.

* ``--legacy``: answer ``server/discover`` with "method not found", as servers
  built for the 2025 protocol do, so clients fall back to the ``initialize``
  handshake and get an MCP session (an ``mcp-session-id``). Restarting such a
  server forgets its sessions: the old id then answers 404.
* ``--oauth``: protect ``/mcp`` with OAuth 2.1; the same app is the
  authorization server (metadata, dynamic client registration, ``/authorize``,
  ``/token``), backed by :class:`InMemoryOAuthProvider`, which approves every
  authorization request at once (the user who clicks "allow").

Tools: ``echo_headers`` (the request headers whose name starts with ``x-``),
``search`` (``readOnlyHint``), ``whoami`` (the server's process id).
"""

from __future__ import annotations

import argparse
import os
import secrets
import time
from typing import Any

import uvicorn
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    RefreshToken,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.shared.auth import OAuthClientInformationFull, OAuthToken
from mcp.shared.exceptions import MCPError
from mcp.types import METHOD_NOT_FOUND, ToolAnnotations


class InMemoryOAuthProvider:
    """An OAuth authorization server in memory that approves every request."""

    def __init__(self) -> None:
        self.clients: dict[str, OAuthClientInformationFull] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.tokens: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        self.clients[client_info.client_id] = client_info

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        code = secrets.token_urlsafe(24)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or ["mcp"],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: Any, authorization_code: str) -> AuthorizationCode | None:
        return self.codes.get(authorization_code)

    async def exchange_authorization_code(
        self, client: Any, authorization_code: AuthorizationCode
    ) -> OAuthToken:
        self.codes.pop(authorization_code.code, None)
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.tokens[access] = AccessToken(
            token=access,
            client_id=client.client_id,
            scopes=authorization_code.scopes,
            expires_at=int(time.time()) + 3600,
            resource=authorization_code.resource,
        )
        self.refresh[refresh] = RefreshToken(
            token=refresh, client_id=client.client_id, scopes=authorization_code.scopes
        )
        return OAuthToken(
            access_token=access,
            token_type="Bearer",
            expires_in=3600,
            scope=" ".join(authorization_code.scopes),
            refresh_token=refresh,
        )

    async def load_refresh_token(self, client: Any, refresh_token: str) -> RefreshToken | None:
        return self.refresh.get(refresh_token)

    async def exchange_refresh_token(
        self, client: Any, refresh_token: RefreshToken, scopes: list[str]
    ) -> OAuthToken:
        raise NotImplementedError

    async def load_access_token(self, token: str) -> AccessToken | None:
        return self.tokens.get(token)

    async def revoke_token(self, token: Any) -> None:
        self.tokens.pop(getattr(token, "token", ""), None)


async def refuse_discover(ctx: Any, call_next: Any) -> Any:
    """Middleware: answer ``server/discover`` like a server built for the 2025 protocol."""
    if ctx.method == "server/discover":
        raise MCPError(code=METHOD_NOT_FOUND, message="Method not found")
    return await call_next(ctx)


def build(port: int, *, legacy: bool, oauth: bool) -> Any:
    base = f"http://127.0.0.1:{port}"
    kwargs: dict[str, Any] = {}
    if oauth:
        kwargs["auth_server_provider"] = InMemoryOAuthProvider()
        kwargs["auth"] = AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=["mcp"], default_scopes=["mcp"]
            ),
            required_scopes=["mcp"],
            validate_token_resource=False,
        )
    server = MCPServer("test-http", log_level="WARNING", **kwargs)
    if legacy:
        server.middleware.append(refuse_discover)

    @server.tool()
    def echo_headers(ctx: Context) -> str:
        """The request headers whose name starts with x-."""
        headers = ctx.headers or {}
        return "\n".join(f"{k}: {v}" for k, v in sorted(headers.items()) if k.lower().startswith("x-"))

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def search(query: str) -> str:
        """Search."""
        return f"found: {query}"

    @server.tool()
    def whoami() -> str:
        """The server's process id."""
        return str(os.getpid())

    return server.streamable_http_app()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--legacy", action="store_true")
    parser.add_argument("--oauth", action="store_true")
    args = parser.parse_args()
    app = build(args.port, legacy=args.legacy, oauth=args.oauth)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
