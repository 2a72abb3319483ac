"""MCP over Streamable HTTP against a real server on loopback (tests/support/mcp_http_server.py:
the mcp SDK's MCPServer on uvicorn, in a subprocess of its own): headers, sessions the
server expires, session termination, and OAuth against the server's own authorization server."""

from __future__ import annotations

from urllib.parse import parse_qs, urlparse

import httpx2
import pytest
from mcp.client.auth import OAuthClientProvider
from mcp.shared.auth import OAuthClientMetadata

from lattice_worker import ConfigError, MCPConnectionError, connect_mcp_streamable_http_server
from lattice_worker.tools.tool import ToolContext
from tests.support.mcp_servers import free_port, http_server

CTX = ToolContext(tool_use_id="toolu_test", tool_name="test")


async def call(conn, server_name, arguments=None):
    tool = {t.metadata["mcp"]["name"]: t for t in conn.tools}[server_name]
    return await tool.invoke(tool.parse_input(arguments or {}), CTX)


def text_of(result) -> str:
    if isinstance(result.content, str):
        return result.content
    return "".join(b.get("text", "") for b in result.content)


@pytest.fixture
def legacy_server(tmp_path):
    with http_server("--legacy", log_path=tmp_path / "server.log") as server:
        yield server


async def test_headers_reach_the_server_and_tools_load(tmp_path):
    with http_server(log_path=tmp_path / "server.log") as server:
        async with connect_mcp_streamable_http_server(
            server.url, name_prefix="remote", headers={"X-Workspace": "demo", "X-Team": "blue"}
        ) as conn:
            assert sorted(t.name for t in conn.tools) == [
                "remote_echo_headers",
                "remote_search",
                "remote_whoami",
            ]
            echoed = text_of(await call(conn, "echo_headers"))
            assert echoed.splitlines() == ["x-team: blue", "x-workspace: demo"]
            search = {t.name: t for t in conn.tools}["remote_search"]
            assert search.metadata["mcp"]["annotations"] == {"readOnlyHint": True}
            # a server on the session-less protocol: no session to end
            assert conn.session_id is None
            assert await conn.terminate_session() is False


async def test_a_session_the_server_expired_is_reinitialised_once_and_the_call_retried(legacy_server):
    async with connect_mcp_streamable_http_server(legacy_server.url) as conn:
        first_session = conn.session_id
        assert first_session
        first_pid = text_of(await call(conn, "whoami"))

        legacy_server.restart()  # the new server process knows no session: the old id answers 404
        result = await call(conn, "whoami")
        assert result.is_error is False
        assert text_of(result) != first_pid
        assert conn.reconnects == 1
        assert conn.session_id and conn.session_id != first_session
        assert text_of(await call(conn, "search", {"query": "q"})) == "found: q"
        assert conn.reconnects == 1


async def test_terminate_session_ends_it_and_the_next_call_opens_a_new_one(legacy_server):
    async with connect_mcp_streamable_http_server(legacy_server.url) as conn:
        first_session = conn.session_id
        assert await conn.terminate_session() is True
        assert conn.session_id is None
        # the server forgot it: the old id now answers 404
        async with httpx2.AsyncClient() as http:
            stale = await http.post(
                legacy_server.url,
                headers={"mcp-session-id": first_session, "accept": "application/json, text/event-stream"},
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            )
        assert stale.status_code == 404
        assert text_of(await call(conn, "search", {"query": "again"})) == "found: again"
        assert conn.session_id and conn.session_id != first_session


class MemoryTokenStorage:
    def __init__(self) -> None:
        self.tokens = None
        self.client_info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens) -> None:
        self.tokens = tokens

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info) -> None:
        self.client_info = client_info


async def test_oauth_authorization_code_flow_with_finish_auth(tmp_path):
    with http_server("--oauth", log_path=tmp_path / "server.log") as server:
        # without credentials the protected server refuses, and the error says so
        with pytest.raises(MCPConnectionError) as refused:
            await connect_mcp_streamable_http_server(server.url, connect_timeout=20)
        assert "HTTP 401 Unauthorized" in str(refused.value) and "auth_provider" in str(refused.value)

        storage = MemoryTokenStorage()
        provider = OAuthClientProvider(
            server_url=server.url,
            client_metadata=OAuthClientMetadata(
                redirect_uris=["http://localhost:8976/callback"],
                client_name="lattice-test",
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
            ),
            storage=storage,
        )
        conn = await connect_mcp_streamable_http_server(
            server.url, auth_provider=provider, connect_timeout=20
        )
        try:
            assert conn.auth_pending and conn.tools == []
            assert conn.authorization_url.startswith(f"http://127.0.0.1:{server.port}/authorize?")
            pending = await call_pending(conn)
            assert "finish_auth" in pending

            # the user's browser: the authorization server approves and redirects back with a code
            async with httpx2.AsyncClient() as browser:
                answer = await browser.get(conn.authorization_url, follow_redirects=False)
            assert answer.status_code == 302
            location = urlparse(answer.headers["location"])
            assert f"{location.scheme}://{location.netloc}{location.path}" == "http://localhost:8976/callback"
            code = parse_qs(location.query)["code"][0]

            await conn.finish_auth(code)
            assert not conn.auth_pending and conn.authorization_url is None
            assert storage.tokens is not None and storage.tokens.access_token
            assert sorted(t.name for t in conn.tools) == ["echo_headers", "search", "whoami"]
            assert text_of(await call(conn, "search", {"query": "authorized"})) == "found: authorized"
            with pytest.raises(MCPConnectionError, match="no OAuth authorization is pending"):
                await conn.finish_auth(code)
        finally:
            await conn.close()


async def call_pending(conn) -> str:
    """A call while the authorization is pending is refused with an error naming finish_auth."""
    with pytest.raises(MCPConnectionError) as caught:
        await conn.client.call_tool("search", {"query": "x"})
    return str(caught.value)


async def test_unreachable_server_and_bad_arguments():
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with pytest.raises(MCPConnectionError, match="cannot reach"):
        await connect_mcp_streamable_http_server(url, connect_timeout=20)
    with pytest.raises(ConfigError, match="url"):
        connect_mcp_streamable_http_server("ftp://example.com/mcp")
    with pytest.raises(ConfigError, match="headers"):
        connect_mcp_streamable_http_server(url, headers={"X-A": 1})
    with pytest.raises(ConfigError, match="auth_provider"):
        connect_mcp_streamable_http_server(url, auth_provider="token")
