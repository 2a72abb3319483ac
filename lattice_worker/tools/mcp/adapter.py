"""MCP tools as agent tools: :func:`create_mcp_tools` and the :class:`MCPClient` protocol.

``create_mcp_tools(client)`` lists the server's tools (every page) and returns
one :class:`~lattice_worker.tools.tool.ToolDefinition` per tool:

* ``name``: provider-safe and unique (:mod:`.naming`); the call goes to the
  server's own name;
* ``input_schema``: converted by :mod:`.schema` (references inlined, a root
  union merged into one object); a tool whose schema cannot be converted is
  refused alone (a warning is logged naming it and why) while the others load;
* ``metadata["mcp"]``: ``{"server": server name, "name": the server's tool
  name, "annotations": the tool's MCP annotations (``readOnlyHint``,
  ``destructiveHint``, ``idempotentHint``, ``openWorldHint``, ``title``) as
  the server sent them}``;
* ``is_concurrency_safe``: ``True`` for a tool the server marks
  ``readOnlyHint: true``;
* ``effect``: from the annotations (:func:`~lattice_worker.tools.effects.effect_from_mcp_annotations`:
  ``readOnlyHint`` -> read_only, else ``idempotentHint`` -> idempotent over its
  input, else unguarded; ``docs/tool-effects.md``).

A call never raises into the agent loop for a server-side problem: an error
result (``isError``), an MCP error, a connection the server closed, or a call
that exceeded ``call_timeout`` seconds all become an ``is_error`` tool result
whose text names the server and the tool.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import mcp.types as mcp_types
from mcp import ClientSession
from mcp.shared.exceptions import MCPError
from pydantic import ValidationError

from ...errors import ConfigError
from ..effects import effect_from_mcp_annotations
from ..mcp_servers import DEFAULT_CALL_TIMEOUT_SECONDS
from ..tool import ToolContext, ToolDefinition, ToolInputError, ToolResult
from .naming import assign_tool_names
from .results import error_result, to_tool_result
from .schema import MCPSchemaError, convert_input_schema

logger = logging.getLogger("lattice_worker.mcp")

MAX_LIST_PAGES = 100
"""``tools/list`` pages read at most (a server whose cursor never ends cannot hang a listing)."""

_GUARD_SECONDS = 1.0
"""Extra seconds the outer guard waits beyond the SDK's own request timeout."""


@runtime_checkable
class MCPClient(Protocol):
    """The minimal MCP client :func:`create_mcp_tools` needs.

    The SDK's high-level ``mcp.Client`` satisfies it as it is; an
    ``mcp.ClientSession`` is accepted too (wrapped). ``list_tools`` returns an
    ``mcp.types.ListToolsResult`` (``tools`` and ``next_cursor``); ``call_tool``
    an ``mcp.types.CallToolResult``; ``read_timeout_seconds`` is in seconds.
    """

    async def list_tools(self, *, cursor: str | None = None) -> Any: ...

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, read_timeout_seconds: float | None = None
    ) -> Any: ...


class ManagedMCPClient:
    """Base of the clients our connections hand out (``connection.client``).

    Such a client bounds its own calls (reconnecting a dead server first, then
    the call timeout), so the adapter adds no guard of its own. Subclasses set
    ``server_name`` and ``call_timeout`` and implement the :class:`MCPClient` methods.
    """

    server_name: str = "mcp"
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS

    async def list_tools(self, *, cursor: str | None = None) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, read_timeout_seconds: float | None = None
    ) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class _SessionClient:
    """An ``mcp.ClientSession`` seen through :class:`MCPClient`."""

    def __init__(self, session: ClientSession) -> None:
        self._session = session

    @property
    def server_info(self) -> Any:
        return self._session.server_info

    async def list_tools(self, *, cursor: str | None = None) -> Any:
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
        return await self._session.list_tools(params=params)

    async def call_tool(
        self, name: str, arguments: dict[str, Any] | None = None, read_timeout_seconds: float | None = None
    ) -> Any:
        return await self._session.call_tool(name, arguments, read_timeout_seconds=read_timeout_seconds)


def _as_client(client: Any) -> Any:
    if isinstance(client, ClientSession):
        return _SessionClient(client)
    if callable(getattr(client, "list_tools", None)) and callable(getattr(client, "call_tool", None)):
        return client
    raise ConfigError(
        "create_mcp_tools: client must be an mcp.ClientSession, an mcp.Client, a connection's .client, "
        f"or an object with async list_tools() and call_tool(name, arguments); got {type(client).__name__}"
    )


def _server_name_of(client: Any) -> str:
    name = getattr(client, "server_name", None)
    if isinstance(name, str) and name:
        return name
    try:
        info = getattr(client, "server_info", None)
    except Exception:  # noqa: BLE001 - a property of a client not yet connected
        info = None
    name = getattr(info, "name", None)
    return name if isinstance(name, str) and name else "mcp"


async def list_all_tools(client: Any) -> list[mcp_types.Tool]:
    """Every tool ``client`` lists, following ``next_cursor`` (at most :data:`MAX_LIST_PAGES` pages)."""
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    for page in range(MAX_LIST_PAGES):
        result = await (client.list_tools() if page == 0 else client.list_tools(cursor=cursor))
        items = result if isinstance(result, list) else getattr(result, "tools", None)
        if items is None:
            raise TypeError(f"list_tools() returned {type(result).__name__}, not a ListToolsResult")
        tools.extend(t if isinstance(t, mcp_types.Tool) else mcp_types.Tool.model_validate(t) for t in items)
        cursor = None if isinstance(result, list) else getattr(result, "next_cursor", None)
        if not cursor:
            break
    else:
        logger.warning("MCP tools/list still had a next cursor after %d pages; stopped there", MAX_LIST_PAGES)
    return tools


def call_error_text(server: str, tool: str, exc: BaseException, timeout: float) -> str:
    """What the model is told when a call to ``tool`` on ``server`` failed with ``exc``."""
    where = f'MCP tool "{tool}" on server "{server}"'
    if isinstance(exc, MCPError):
        if exc.code == mcp_types.REQUEST_TIMEOUT:
            return f"{where} did not answer within the call timeout of {timeout:g} s"
        if exc.code == mcp_types.CONNECTION_CLOSED:
            return (
                f'the connection to MCP server "{server}" closed during the call to "{tool}" '
                "(the server process exited or the connection was lost); the call may or may not have run"
            )
        return f"{where} failed with MCP error {exc.code}: {exc.message}"
    if isinstance(exc, TimeoutError):
        return f"{where} did not answer within the call timeout of {timeout:g} s"
    if isinstance(exc, ValidationError):
        return f"{where} returned a result that is not a valid MCP CallToolResult: {exc.errors()[:1]}"
    detail = str(exc) or type(exc).__name__
    return f"{where} failed: {type(exc).__name__}: {detail}"


def _annotations_of(tool: mcp_types.Tool) -> dict[str, Any]:
    if tool.annotations is None:
        return {}
    return tool.annotations.model_dump(by_alias=True, exclude_none=True)


def _strict_validator(schema: dict[str, Any] | None) -> Any:
    if schema is None:
        return None
    import jsonschema  # a dependency of mcp

    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema)


def _make_handler(
    client: Any, managed: bool, server: str, mcp_name: str, model_name: str, strict: Any, timeout: float
):
    async def handler(args: dict[str, Any], ctx: ToolContext) -> ToolResult:
        if strict is not None:
            errors = sorted(strict.iter_errors(args), key=lambda e: list(e.path))
            if errors:
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or '(input)'}: {e.message}" for e in errors
                )
                raise ToolInputError(f'invalid input for tool "{model_name}": {detail}')
        try:
            if managed:
                result = await client.call_tool(mcp_name, args, timeout)
            else:
                async with asyncio.timeout(timeout + _GUARD_SECONDS):
                    result = await client.call_tool(mcp_name, args, read_timeout_seconds=timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every server-side failure becomes an error result
            logger.info("MCP call %s on %s failed: %r", mcp_name, server, exc)
            return error_result(call_error_text(server, mcp_name, exc, timeout))
        if not isinstance(result, mcp_types.CallToolResult):
            try:
                result = mcp_types.CallToolResult.model_validate(result)
            except ValidationError as exc:
                return error_result(call_error_text(server, mcp_name, exc, timeout))
        return to_tool_result(result)

    return handler


def build_tools(
    client: Any,
    listed: Sequence[mcp_types.Tool],
    *,
    name_prefix: str | None,
    server_name: str,
    call_timeout: float,
) -> tuple[list[ToolDefinition], list[tuple[str, str]]]:
    """ToolDefinitions for ``listed`` (see the module doc), plus the refused tools
    as ``(server's tool name, reason)`` pairs."""
    managed = isinstance(client, ManagedMCPClient)
    names = assign_tool_names([t.name for t in listed], prefix=name_prefix)
    tools: list[ToolDefinition] = []
    refused: list[tuple[str, str]] = []
    for tool, model_name in zip(listed, names, strict=True):
        try:
            converted = convert_input_schema(tool.input_schema)
            description = (tool.description or "").strip() or (tool.title or "").strip()
            if not description:
                description = f'The "{tool.name}" tool of the MCP server "{server_name}".'
            annotations = _annotations_of(tool)
            effect, dedup_window_s = effect_from_mcp_annotations(annotations)
            definition = ToolDefinition(
                name=model_name,
                description=description,
                input_model=converted.model_schema,
                handler=_make_handler(
                    client,
                    managed,
                    server_name,
                    tool.name,
                    model_name,
                    _strict_validator(converted.strict_schema),
                    call_timeout,
                ),
                is_concurrency_safe=True if annotations.get("readOnlyHint") is True else None,
                metadata={"mcp": {"server": server_name, "name": tool.name, "annotations": annotations}},
                effect=effect,
                dedup_window_s=dedup_window_s,
            )
        except (MCPSchemaError, ConfigError) as exc:
            reason = str(exc)
            refused.append((tool.name, reason))
            logger.warning('MCP server "%s": tool "%s" refused: %s', server_name, tool.name, reason)
            continue
        if converted.unresolved_refs:
            logger.warning(
                'MCP server "%s": tool "%s" has schema references that do not resolve (%s); '
                "they accept any value",
                server_name,
                tool.name,
                ", ".join(converted.unresolved_refs),
            )
        tools.append(definition)
    return tools, refused


async def create_mcp_tools(
    client: Any,
    *,
    name_prefix: str | None = None,
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS,
    server_name: str | None = None,
) -> list[ToolDefinition]:
    """Map an MCP client's tools to agent tools (see the module doc).

    ``client``: an ``mcp.ClientSession`` (initialised), an ``mcp.Client`` (entered),
    a connection's ``.client``, or any :class:`MCPClient`. The caller owns its
    lifecycle; the tools call it until it is closed. ``name_prefix``: joined to
    every name with ``_`` (``"docs"`` -> ``docs_search``). ``call_timeout``:
    seconds per call (for a connection's client, the connection's own timeout
    applies instead). ``server_name``: the name used in metadata and error
    texts (default: the server's ``serverInfo.name``).

    Raises :class:`ConfigError` for a client without ``list_tools``/``call_tool``
    or a non-positive ``call_timeout``; whatever the listing raises (an
    ``mcp.MCPError``, a ``pydantic.ValidationError`` when the server listed a
    tool the SDK refuses) propagates.
    """
    if not isinstance(call_timeout, int | float) or isinstance(call_timeout, bool) or call_timeout <= 0:
        raise ConfigError(
            f"create_mcp_tools: call_timeout must be a positive number of seconds, got {call_timeout!r}"
        )
    if name_prefix is not None and not isinstance(name_prefix, str):
        raise ConfigError(f"create_mcp_tools: name_prefix must be a string, got {type(name_prefix).__name__}")
    adapted = _as_client(client)
    name = server_name or _server_name_of(adapted)
    listed = await list_all_tools(adapted)
    tools, _refused = build_tools(
        adapted, listed, name_prefix=name_prefix, server_name=name, call_timeout=float(call_timeout)
    )
    return tools


__all__ = [
    "DEFAULT_CALL_TIMEOUT_SECONDS",
    "MCPClient",
    "ManagedMCPClient",
    "build_tools",
    "call_error_text",
    "create_mcp_tools",
    "list_all_tools",
]
