"""Connections to MCP servers on the official ``mcp`` SDK: what stdio and HTTP share.

A connection runs one ``mcp.Client`` (the SDK's high-level client: it
negotiates the protocol version -- ``server/discover``, falling back to the
``initialize`` handshake) inside a task of its own, so the connection can be
used and closed from any task of the event loop that opened it. An MCP
session is bound to that loop: never share a connection between loops.

Bounds (seconds, per connection): ``connect_timeout`` for the handshake and
the first tool listing (:data:`~lattice_worker.tools.mcp_servers.DEFAULT_CONNECT_TIMEOUT_SECONDS`),
``call_timeout`` for one tool call
(:data:`~lattice_worker.tools.mcp_servers.DEFAULT_CALL_TIMEOUT_SECONDS`).

When the server goes away (its process exits, the connection drops) the calls
in flight end at once as ``is_error`` results, and the next call first opens
the connection again (starts the server again) -- once per call; a call that
was in flight is never sent twice. The transports: :mod:`.stdio`, :mod:`.http`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Generator
from contextlib import AbstractAsyncContextManager
from importlib import metadata
from typing import Any, Generic, TypeVar

import mcp
import mcp.types as mcp_types
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from ...errors import ConfigError, LatticeError
from ..mcp_servers import (
    DEFAULT_CONNECT_TIMEOUT_SECONDS,
    positive_seconds,
)
from ..tool import ToolDefinition
from .adapter import ManagedMCPClient, build_tools, list_all_tools

logger = logging.getLogger("lattice_worker.mcp")

STOP_TIMEOUT_SECONDS = 10.0
"""Seconds ``close()`` waits for the SDK to stop a server (it closes stdin, then kills after ~4 s)."""

_GUARD_SECONDS = 1.0


class MCPConnectionError(LatticeError):
    """An MCP server could not be reached or used: it did not start, refused the
    handshake, was closed, or belongs to another event loop. ``server`` names it."""

    def __init__(self, message: str, *, server: str) -> None:
        super().__init__(message)
        self.server = server


class MCPConnectTimeoutError(MCPConnectionError, TimeoutError):
    """The server did not complete the MCP handshake within ``connect_timeout`` seconds."""


def _client_info() -> mcp_types.Implementation:
    try:
        version = metadata.version("agent-lattice")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
        version = "0"
    return mcp_types.Implementation(name="agent-lattice", version=version)


def _positive(where: str, key: str, value: Any) -> float:
    try:
        return positive_seconds(where, key, value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _leaf(exc: BaseException) -> BaseException:
    """The first non-group exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _Generation:
    """One live ``mcp.Client``: one server process (stdio) or one HTTP session."""

    __slots__ = ("client", "task", "stop", "dead", "session_id")

    def __init__(self) -> None:
        self.client: mcp.Client | None = None
        self.task: asyncio.Task[None] | None = None
        self.stop = asyncio.Event()
        self.dead = False
        self.session_id: str | None = None


class MCPConnectionClient(ManagedMCPClient):
    """``connection.client``: the :class:`~.adapter.MCPClient` of a connection.

    Its calls go through the connection (reopened first when the server died,
    bounded by the connection's timeouts). Pass it to ``create_mcp_tools`` for
    another prefix or timeout over the same connection.
    """

    def __init__(self, connection: MCPConnection) -> None:
        self._connection = connection

    @property
    def server_name(self) -> str:  # type: ignore[override]
        return self._connection.server_name

    @property
    def call_timeout(self) -> float:  # type: ignore[override]
        return self._connection.call_timeout

    async def list_tools(self, *, cursor: str | None = None) -> mcp_types.ListToolsResult:
        return await self._connection._list_tools(cursor)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, read_timeout_seconds: float | None = None
    ) -> mcp_types.CallToolResult:
        return await self._connection._call_tool(name, arguments, read_timeout_seconds)


class MCPConnection:
    """What the connect functions return (:class:`MCPStdioConnection`,
    ``MCPStreamableHTTPConnection``); use it with ``async with`` or call :meth:`close`.

    Attributes:
        tools: the server's tools as agent tools (names prefixed, provider-safe).
        client: an :class:`~.adapter.MCPClient` over this connection.
        refused_tools: ``(server's tool name, reason)`` for each tool whose input
            schema could not be given to the model.
        server_name: the server's ``serverInfo.name`` (else ``name_prefix``, else
            the command or URL).
        connect_timeout / call_timeout: the bounds, in seconds.
        reconnects: how many times the connection was opened again after the
            server went away (or its HTTP session expired).
    """

    _kind = "MCP"

    def __init__(
        self, *, label: str, name_prefix: str | None, connect_timeout: float, call_timeout: float
    ) -> None:
        self._label = label
        self.name_prefix = name_prefix
        self.connect_timeout = connect_timeout
        self.call_timeout = call_timeout
        self.server_name = name_prefix or label
        self.tools: list[ToolDefinition] = []
        self.refused_tools: list[tuple[str, str]] = []
        self.reconnects = 0
        self.client = MCPConnectionClient(self)
        self._gen: _Generation | None = None
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"{type(self).__name__}(server={self.server_name!r}, tools={len(self.tools)}, {state})"

    # ------------------------------------------------------------ subclass hooks

    def _transport(self, gen: _Generation) -> AbstractAsyncContextManager[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _describe_failure(self, exc: BaseException) -> str:
        return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__

    async def _await_ready(self, ready: asyncio.Future[None]) -> bool:
        """Wait for the handshake; True when done (False: it waits for a person, HTTP OAuth)."""
        async with asyncio.timeout(self.connect_timeout):
            await asyncio.shield(ready)
        return True

    def _after_ready(self, gen: _Generation) -> None:
        """Called once ``gen`` completed its handshake."""

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, Exception):
            logger.warning('MCP server "%s": transport error: %s', self.server_name, message)

    # ------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> bool:
        """True while the server is reachable as far as the connection knows (False
        after close, or once a stdio server's process has exited: the next call
        starts it again)."""
        gen = self._gen
        return not self._closed and gen is not None and not gen.dead and gen.client is not None

    @property
    def session(self) -> mcp.ClientSession | None:
        """The SDK's live ``ClientSession`` (``None`` while disconnected), for what
        the connection does not wrap (resources, prompts)."""
        gen = self._gen
        return gen.client.session if gen is not None and gen.client is not None else None

    async def _own(self, gen: _Generation, ready: asyncio.Future[None]) -> None:
        """The task that holds one ``mcp.Client`` open until ``gen.stop`` is set."""
        try:
            client = mcp.Client(
                self._transport(gen), message_handler=self._on_message, client_info=_client_info()
            )
            async with client:
                gen.client = client
                if not ready.done():
                    ready.set_result(None)
                await gen.stop.wait()
        except asyncio.CancelledError:
            if not ready.done():
                ready.cancel()
            raise
        except BaseException as exc:  # noqa: BLE001 - reported through `ready`, or logged
            if not ready.done():
                ready.set_exception(exc)
            else:
                logger.debug('MCP server "%s": connection ended: %r', self.server_name, exc)
        finally:
            gen.client = None
            gen.dead = True

    async def _stop(self, gen: _Generation) -> None:
        gen.dead = True
        gen.stop.set()
        task = gen.task
        if task is None or task.done():
            return
        if gen.client is None:
            task.cancel()  # still in the handshake: nothing to wind down politely
        try:
            async with asyncio.timeout(STOP_TIMEOUT_SECONDS):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
        except Exception:  # noqa: BLE001 - the owner task logs its own failures
            pass

    async def _open(self) -> tuple[_Generation, bool]:
        """Open a new generation. Returns ``(gen, done)`` (``done`` False: the
        handshake waits for a person, see ``_on_pending``); raises MCPConnectionError."""
        gen = _Generation()
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        gen.task = asyncio.create_task(self._own(gen, ready), name=f"mcp:{self._label}")
        try:
            done = await self._await_ready(ready)
        except asyncio.CancelledError:
            gen.task.cancel()
            raise
        except BaseException as exc:
            gen.task.cancel()
            with contextlib.suppress(BaseException):
                await gen.task
            raise connect_failure(self, exc) from None
        if done:
            self._ready(gen)
        else:
            self._on_pending(gen, ready)
        return gen, done

    def _on_pending(self, gen: _Generation, ready: asyncio.Future[None]) -> None:
        """The handshake of ``gen`` waits for a person (HTTP OAuth)."""

    def _ready(self, gen: _Generation) -> None:
        client = gen.client
        info = client.server_info if client is not None else None
        if self.name_prefix is None and info is not None and info.name:
            self.server_name = info.name
        self._after_ready(gen)

    def _timeout_hint(self) -> str:
        return ""

    async def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        gen, done = await self._open()
        if done:
            self._gen = gen
            await self._load_tools()

    async def _load_tools(self) -> None:
        try:
            async with asyncio.timeout(self.connect_timeout):
                listed = await list_all_tools(self.client)
        except BaseException as exc:
            await self.close()
            if isinstance(exc, asyncio.CancelledError):
                raise
            leaf = _leaf(exc)
            detail = self._describe_failure(leaf)
            if isinstance(leaf, ValidationError):
                detail = (
                    'it listed tools the mcp SDK refuses (every inputSchema needs "type": "object" '
                    f"at its root): {leaf}"
                )
            raise MCPConnectionError(
                f'{self._kind} server "{self._label}": tools/list failed: {detail}', server=self._label
            ) from leaf
        self.tools, self.refused_tools = build_tools(
            self.client,
            listed,
            name_prefix=self.name_prefix,
            server_name=self.server_name,
            call_timeout=self.call_timeout,
        )

    async def close(self) -> None:
        """Close the connection (stops a stdio server process). Idempotent; the
        tools answer ``is_error`` afterwards."""
        if self._closed:
            return
        self._closed = True
        gen, self._gen = self._gen, None
        if gen is not None:
            await self._before_close(gen)
            await self._stop(gen)
        await self._after_close()

    async def _before_close(self, gen: _Generation) -> None:
        """Called before the live generation stops on close (HTTP ends its session)."""

    async def _after_close(self) -> None:
        """Called last on close."""

    async def __aenter__(self: _C) -> _C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------ calls

    @property
    def auth_pending(self) -> bool:
        """True while an OAuth authorization waits for ``finish_auth`` (HTTP only)."""
        return False

    def _check_usable(self, *, allow_pending: bool = False) -> None:
        if self._closed:
            raise MCPConnectionError(
                f'the connection to MCP server "{self.server_name}" is closed', server=self.server_name
            )
        if self.auth_pending and not allow_pending:
            raise MCPConnectionError(
                f'MCP server "{self.server_name}" waits for OAuth authorization: send the user to '
                "connection.authorization_url, then call connection.finish_auth(code)",
                server=self.server_name,
            )
        if self._loop is not None and asyncio.get_running_loop() is not self._loop:
            raise MCPConnectionError(
                f'the connection to MCP server "{self.server_name}" belongs to another event loop; '
                "an MCP session cannot be shared between loops (open one connection per loop)",
                server=self.server_name,
            )

    def _needs_reopen(self, gen: _Generation | None) -> bool:
        return gen is None or gen.dead or gen.client is None

    async def _settle(self, gen: _Generation | None) -> None:
        """Let I/O already pending on the loop reach the connection (see MCPStdioConnection)."""

    async def _live(self) -> tuple[_Generation, mcp.Client]:
        """The live generation, opened again first if the server went away."""
        self._check_usable()
        await self._settle(self._gen)
        gen = self._gen
        if self._needs_reopen(gen):
            async with self._lock:
                gen = self._gen
                if self._needs_reopen(gen):
                    gen = await self._reopen(gen)
        assert gen is not None and gen.client is not None
        return gen, gen.client

    async def _reopen(self, old: _Generation | None) -> _Generation:
        if old is not None:
            await self._stop(old)
        self._check_usable()
        gen, done = await self._open()
        if not done:
            self._gen = None
            self._check_usable()  # raises: authorization pending
        self._gen = gen
        self.reconnects += 1
        logger.info('MCP server "%s": connection opened again (%d)', self.server_name, self.reconnects)
        return gen

    def _should_retry(self, gen: _Generation, exc: MCPError) -> bool:
        """Whether a failed request certainly did not reach the server (an expired
        HTTP session) and may be sent again once on a new connection."""
        return False

    async def _request(self, send: Any) -> Any:
        gen, client = await self._live()
        try:
            return await send(client)
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED:
                await self._mark_dead(gen)
                raise
            if not self._should_retry(gen, exc):
                raise
        async with self._lock:
            if self._gen is gen:
                await self._reopen(gen)
        _gen, client = await self._live()
        return await send(client)

    async def _mark_dead(self, gen: _Generation) -> None:
        gen.dead = True
        gen.stop.set()  # the owner task stops the (dead) server process and frees the transport

    async def _list_tools(self, cursor: str | None) -> mcp_types.ListToolsResult:
        return await self._request(lambda c: c.list_tools(cursor=cursor))

    async def _call_tool(
        self, name: str, arguments: dict[str, Any] | None, read_timeout_seconds: float | None
    ) -> mcp_types.CallToolResult:
        seconds = read_timeout_seconds if read_timeout_seconds is not None else self.call_timeout

        async def send(client: mcp.Client) -> mcp_types.CallToolResult:
            async with asyncio.timeout(seconds + _GUARD_SECONDS):
                return await client.call_tool(name, arguments, read_timeout_seconds=seconds)

        return await self._request(send)


_C = TypeVar("_C", bound=MCPConnection)


def connect_failure(connection: MCPConnection, exc: BaseException) -> MCPConnectionError:
    """The error a failed connect (or ``finish_auth``) of ``connection`` raises."""
    label = connection._label
    if isinstance(exc, TimeoutError):
        return MCPConnectTimeoutError(
            f'{connection._kind} server "{label}" did not complete the MCP handshake within '
            f"connect_timeout={connection.connect_timeout:g} s{connection._timeout_hint()}",
            server=label,
        )
    leaf = _leaf(exc)
    error = MCPConnectionError(
        f'could not connect to {connection._kind} server "{label}": {connection._describe_failure(leaf)}',
        server=label,
    )
    error.__cause__ = leaf
    return error


class _Connecting(Generic[_C]):
    """What a connect function returns: ``await`` it for the connection, or use it
    with ``async with`` (the connection closes at the end of the block)."""

    def __init__(self, connection: _C) -> None:
        self._connection = connection
        self._started = False

    async def _connect(self) -> _C:
        if self._started:
            raise RuntimeError("this connect call was already awaited")
        self._started = True
        await self._connection._start()
        return self._connection

    def __await__(self) -> Generator[Any, None, _C]:
        return self._connect().__await__()

    async def __aenter__(self) -> _C:
        return await self._connect()

    async def __aexit__(self, *exc: object) -> None:
        await self._connection.close()


__all__ = [
    "DEFAULT_CONNECT_TIMEOUT_SECONDS",
    "MCPConnection",
    "MCPConnectionClient",
    "MCPConnectionError",
    "MCPConnectTimeoutError",
    "connect_failure",
]
