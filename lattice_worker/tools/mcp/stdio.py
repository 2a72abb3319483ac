"""stdio MCP servers: :func:`connect_mcp_stdio_server`.

The server runs as a subprocess of the SDK's ``stdio_client`` (its own process
group; on close the SDK closes its stdin, then terminates and kills it). Its
stderr goes to ``errlog`` (this process's stderr by default; under Celery,
whose ``sys.stderr`` has no file descriptor, the original one). A line on its
stdout that is not MCP JSON-RPC (a banner, a stray ``print``) is skipped by
the SDK; the connection logs a warning quoting it and keeps it in
:attr:`MCPStdioConnection.stdout_noise` -- it never hangs the handshake (a
server that never answers fails the connect after ``connect_timeout``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Any, TextIO

import anyio
import mcp.types as mcp_types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from ...errors import ConfigError
from ..mcp_servers import DEFAULT_CALL_TIMEOUT_SECONDS, DEFAULT_CONNECT_TIMEOUT_SECONDS, check_stdio_server
from .connection import MCPConnection, _Connecting, _Generation, _positive

logger = logging.getLogger("lattice_worker.mcp")

MAX_NOISE_LINES = 20
"""Non-protocol stdout lines kept in ``stdout_noise`` (the most recent ones)."""

SETTLE_ITERATIONS = 32
"""Loop iterations a stdio call first yields, so a server's exit already in the pipe is noticed."""


def stdio_parameters(where: str, server: Any) -> StdioServerParameters:
    """``server`` (a dict ``{"command", "args"?, "env"?, "cwd"?}`` or an
    ``mcp.StdioServerParameters``) as ``StdioServerParameters``; raises
    :class:`ConfigError` naming what is wrong."""
    if isinstance(server, StdioServerParameters):
        return server
    if not isinstance(server, dict):
        raise ConfigError(
            f'{where}: server must be a dict {{"command": str, "args": [...], "env": {{...}}, "cwd": str}} '
            f"or an mcp.StdioServerParameters, got {type(server).__name__}"
        )
    try:
        checked = check_stdio_server(where, server)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return StdioServerParameters(**checked)


@contextlib.asynccontextmanager
async def _watch_eof(transport: AbstractAsyncContextManager[Any], gen: _Generation) -> AsyncIterator[Any]:
    """``transport``'s streams, with ``gen.dead`` set as soon as the server's side
    ends (its process exited): the next call then starts the server again first
    instead of being refused by a closed session."""
    async with transport as (read_stream, write_stream):
        relay_send, relay_receive = anyio.create_memory_object_stream[Any](0)

        async def relay() -> None:
            async with relay_send:
                try:
                    async for item in read_stream:
                        await relay_send.send(item)
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
                gen.dead = True  # before the session sees the end of its stream

        async with anyio.create_task_group() as tg:
            tg.start_soon(relay)
            try:
                yield relay_receive, write_stream
            finally:
                tg.cancel_scope.cancel()


def _errlog(errlog: TextIO | None) -> TextIO:
    """A stream with a real file descriptor for the server's stderr (Celery replaces
    ``sys.stderr`` with a logging proxy that has none)."""
    for candidate in (errlog, sys.stderr, sys.__stderr__):
        if candidate is None:
            continue
        try:
            candidate.fileno()
        except (AttributeError, OSError, ValueError):
            continue
        return candidate
    return open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


class MCPStdioConnection(MCPConnection):
    """A stdio MCP server run as a subprocess (see the module doc).

    Attributes (beyond :class:`MCPConnection`): ``parameters`` (the
    ``mcp.StdioServerParameters``), ``stdout_noise`` (the last
    :data:`MAX_NOISE_LINES` lines the server wrote to stdout that were not MCP
    JSON-RPC; they were skipped).
    """

    _kind = "MCP stdio"

    def __init__(
        self,
        parameters: StdioServerParameters,
        *,
        name_prefix: str | None,
        connect_timeout: float,
        call_timeout: float,
        errlog: TextIO | None,
    ) -> None:
        label = shlex.join([os.path.basename(parameters.command), *parameters.args])
        super().__init__(
            label=label[:120],
            name_prefix=name_prefix,
            connect_timeout=connect_timeout,
            call_timeout=call_timeout,
        )
        self.parameters = parameters
        self.stdout_noise: list[str] = []
        self._errlog = errlog

    def _transport(self, gen: _Generation) -> AbstractAsyncContextManager[Any]:
        return _watch_eof(stdio_client(self.parameters, errlog=_errlog(self._errlog)), gen)

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, ValidationError):
            errors = message.errors()
            line = errors[0].get("input") if errors else None
            text = line if isinstance(line, str) else str(message)
            self.stdout_noise = [*self.stdout_noise[-(MAX_NOISE_LINES - 1) :], text]
            logger.warning(
                'MCP stdio server "%s" wrote a line to stdout that is not MCP JSON-RPC; skipped: %.200r',
                self.server_name,
                text,
            )
            return
        await super()._on_message(message)

    async def _settle(self, gen: _Generation | None) -> None:
        # A server that exited while the loop was busy elsewhere (or stopped, as a
        # Celery worker's loop is between tasks) has already closed its pipes; the
        # end of its stdout reaches the connection a few loop iterations later. Give
        # it those iterations, so the call starts the server again instead of being
        # refused by a dead session.
        for _ in range(SETTLE_ITERATIONS):
            if gen is None or gen.dead:
                return
            await asyncio.sleep(0)

    def _timeout_hint(self) -> str:
        if self.stdout_noise:
            return f" (it wrote non-protocol text to stdout: {self.stdout_noise[-1]!r:.200})"
        return ""

    def _describe_failure(self, exc: BaseException) -> str:
        if isinstance(exc, OSError):
            return f"the command could not be started: {exc}"
        if isinstance(exc, MCPError) and exc.code == mcp_types.CONNECTION_CLOSED:
            return (
                "the server closed the connection during the handshake (did the process exit? see its stderr)"
            )
        return super()._describe_failure(exc)


def connect_mcp_stdio_server(
    server: Any,
    *,
    name_prefix: str | None = None,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
    errlog: TextIO | None = None,
) -> _Connecting[MCPStdioConnection]:
    """Start a stdio MCP server and map its tools (``await`` it, or ``async with`` it).

    ``server``: ``{"command": str, "args": [str, ...], "env": {str: str}, "cwd": str}``
    (``args``, ``env``, ``cwd`` optional) or an ``mcp.StdioServerParameters``.
    ``env`` is merged over the SDK's small default environment (``HOME``,
    ``PATH``, ``SHELL``, ``TERM``, ``USER``, ``LOGNAME``); nothing else of this
    process's environment is passed. ``name_prefix``: joined to every tool name
    (``"docs"`` -> ``docs_search``). ``connect_timeout`` / ``call_timeout``:
    seconds. ``errlog``: where the server's stderr goes.

    Returns an :class:`MCPStdioConnection`. Raises :class:`ConfigError` for bad
    arguments (at once), :class:`MCPConnectTimeoutError` when the server does not
    complete the handshake in time, :class:`MCPConnectionError` when it cannot
    be started, closes during the handshake, or its tool listing fails.
    """
    where = "connect_mcp_stdio_server"
    parameters = stdio_parameters(where, server)
    if name_prefix is not None and not isinstance(name_prefix, str):
        raise ConfigError(f"{where}: name_prefix must be a string, got {type(name_prefix).__name__}")
    connection = MCPStdioConnection(
        parameters,
        name_prefix=name_prefix,
        connect_timeout=_positive(where, "connect_timeout", connect_timeout),
        call_timeout=_positive(where, "call_timeout", call_timeout),
        errlog=errlog,
    )
    return _Connecting(connection)


__all__ = ["MCPStdioConnection", "connect_mcp_stdio_server", "stdio_parameters"]
