"""MCP servers' tools as agent tools, on the official ``mcp`` SDK (client side).

* :func:`connect_mcp_stdio_server` -- start a stdio server, map its tools;
* :func:`connect_mcp_streamable_http_server` -- a remote Streamable HTTP server
  (headers, OAuth with ``finish_auth``, sessions);
* :func:`create_mcp_tools` -- map the tools of a client you already own
  (an ``mcp.ClientSession``, an ``mcp.Client``, any :class:`MCPClient`).

Modules: :mod:`.naming` (provider-safe names), :mod:`.schema` (input schemas),
:mod:`.results` (call results), :mod:`.adapter` (tools from a client),
:mod:`.connection` (what connections share), :mod:`.stdio` and :mod:`.http`
(the transports), :mod:`.pool` (the pooled connections of ``mcp_servers=``).
Importing this package imports the ``mcp`` SDK (about a second);
``lattice_worker`` exports these names lazily.
"""

from ..mcp_servers import DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_CONNECT_TIMEOUT_SECONDS
from .adapter import MCPClient, create_mcp_tools
from .connection import MCPConnection, MCPConnectionError, MCPConnectTimeoutError
from .http import MCPStreamableHTTPConnection, connect_mcp_streamable_http_server
from .schema import MCPSchemaError
from .stdio import MCPStdioConnection, connect_mcp_stdio_server

__all__ = [
    "DEFAULT_CALL_TIMEOUT_SECONDS",
    "DEFAULT_CONNECT_TIMEOUT_SECONDS",
    "MCPClient",
    "MCPConnection",
    "MCPConnectTimeoutError",
    "MCPConnectionError",
    "MCPSchemaError",
    "MCPStdioConnection",
    "MCPStreamableHTTPConnection",
    "connect_mcp_stdio_server",
    "connect_mcp_streamable_http_server",
    "create_mcp_tools",
]
