"""Pooled MCP connections for the ``mcp_servers=`` agent option (see
:mod:`lattice_worker.tools.mcp_servers`).

One connection per server per process and per event loop, opened the first
time a query on that loop needs it and kept for every later query there (a
Celery worker's loop lives as long as its thread). Connections are never shared
between loops; after a fork the child starts with an empty pool (the parent's
connections belong to the parent). A pooled connection whose server died
starts it again on its next call (:mod:`.connection`). When a loop is closed
its connections' tasks are cancelled (``asyncio.run`` does that), which stops
their servers; entries of closed loops are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Mapping

from ..mcp_servers import MCPServerConfig
from ..tool import ToolDefinition
from .connection import MCPConnection, MCPConnectionError
from .http import connect_mcp_streamable_http_server
from .stdio import connect_mcp_stdio_server

logger = logging.getLogger("lattice_worker.mcp")


class _Entry:
    __slots__ = ("lock", "connection")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.connection: MCPConnection | None = None


_pid = os.getpid()
_pools: dict[asyncio.AbstractEventLoop, dict[tuple[object, ...], _Entry]] = {}
_pools_lock = threading.Lock()  # worker threads each run a loop of their own


def _pool() -> dict[tuple[object, ...], _Entry]:
    global _pid, _pools
    loop = asyncio.get_running_loop()
    with _pools_lock:
        if os.getpid() != _pid:  # forked: the parent's connections are not ours
            _pid, _pools = os.getpid(), {}
        for closed in [other for other in _pools if other.is_closed()]:
            del _pools[closed]
        return _pools.setdefault(loop, {})


async def _connect(config: MCPServerConfig) -> MCPConnection:
    common = {
        "name_prefix": config.name,
        "connect_timeout": config.connect_timeout,
        "call_timeout": config.call_timeout,
    }
    if config.transport == "stdio":
        assert config.stdio is not None
        return await connect_mcp_stdio_server(config.stdio, **common)
    assert config.url is not None
    return await connect_mcp_streamable_http_server(
        config.url, headers=config.headers, auth_provider=config.auth_provider, **common
    )


async def pooled_connection(config: MCPServerConfig) -> MCPConnection:
    """This loop's connection to ``config``'s server, opened on first use.

    Raises :class:`~.connection.MCPConnectionError` (or its timeout subclass)
    when it cannot be opened, and when the server waits for an OAuth
    authorization (a pooled connection cannot ask a person).
    """
    pool = _pool()
    entry = pool.setdefault(config.key(), _Entry())
    async with entry.lock:
        connection = entry.connection
        if connection is None or connection.closed:
            entry.connection = None
            connection = await _connect(config)
            if connection.auth_pending:
                url = getattr(connection, "authorization_url", None)
                await connection.close()
                raise MCPConnectionError(
                    f'MCP server "{config.name}" needs an OAuth authorization ({url}); give mcp_servers an '
                    "auth_provider that completes it (a callback_handler, or tokens in its storage)",
                    server=config.name,
                )
            entry.connection = connection
    return connection


async def mcp_server_tools(servers: Mapping[str, MCPServerConfig]) -> list[ToolDefinition]:
    """The tools of every server in ``servers`` (an agent's ``mcp_servers``), from
    this loop's pooled connections. A server that cannot be connected is left
    out with a warning naming it and why."""
    tools: list[ToolDefinition] = []
    for config in servers.values():
        try:
            connection = await pooled_connection(config)
        except MCPConnectionError as exc:
            logger.warning('MCP server "%s" left out of this query: %s', config.name, exc)
            continue
        tools.extend(connection.tools)
    return tools


async def close_pooled_connections() -> None:
    """Close this loop's pooled connections (their stdio servers stop); the next
    query opens them again."""
    pool = _pool()
    entries = list(pool.values())
    pool.clear()
    for entry in entries:
        if entry.connection is not None:
            await entry.connection.close()


__all__ = ["close_pooled_connections", "mcp_server_tools", "pooled_connection"]
