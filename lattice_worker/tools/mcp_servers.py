"""Declarative MCP servers: the agent option ``mcp_servers=`` and its validation.

``mcp_servers`` maps a name to a server; the name prefixes the server's tools
(``"docs"`` -> ``docs_search``)::

    define_agent(
        name="researcher",
        mcp_servers={
            "docs": {"command": "python", "args": ["docs_server.py"]},                 # stdio
            "tickets": {"type": "http", "url": "https://mcp.example.com/mcp",
                        "headers": {"Authorization": "Bearer ..."}},                   # Streamable HTTP
        },
    )

A stdio server: ``{"type": "stdio"?, "command", "args"?, "env"?, "cwd"?}`` (or an
``mcp.StdioServerParameters``). A Streamable HTTP server: ``{"type": "http",
"url", "headers"?, "auth_provider"?}`` (``auth_provider``: an
``OAuthClientProvider`` that completes its flow itself -- with a callback
handler, or with tokens already in its storage). Either may add
``"connect_timeout"`` and ``"call_timeout"`` (seconds).

Unlike ``connect_mcp_*`` (one connection you own), these are connected lazily:
when a query of the agent starts, each server's connection is opened on first
use **per process and per event loop** and then reused by every later query
on that loop (an MCP session is bound to its loop, and a worker runs one loop
per thread). A server that died is started again on the next call. A server
that cannot be connected is left out of that query's tools with a warning (its
connect is tried again at the next query).

This module does not import the ``mcp`` SDK (``define_agent`` stays cheap); the
connections live in :mod:`lattice_worker.tools.mcp.pool`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_CONNECT_TIMEOUT_SECONDS = 30.0
"""Seconds a connect (start the server, MCP handshake, first ``tools/list``) may take."""

DEFAULT_CALL_TIMEOUT_SECONDS = 60.0
"""Seconds one MCP tool call may take before it ends as an ``is_error`` result."""

SERVER_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,32}$")

_STDIO_KEYS = {"command", "args", "env", "cwd"}
_HTTP_KEYS = {"url", "headers", "auth_provider"}
_COMMON_KEYS = {"type", "connect_timeout", "call_timeout"}


def positive_seconds(where: str, key: str, value: Any) -> float:
    """``value`` as float seconds; ``ValueError`` naming ``key`` unless a positive number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{where}: {key} must be a positive number of seconds, got {value!r}")
    return float(value)


def check_stdio_server(
    where: str, server: Mapping[str, Any], *, extra: set[str] = frozenset()
) -> dict[str, Any]:
    """The stdio part of ``server`` (``command``, ``args``, ``env``, ``cwd``) checked;
    ``ValueError`` naming what is wrong. Keys in ``extra`` are allowed and ignored."""
    unknown = sorted(set(server) - _STDIO_KEYS - set(extra))
    if unknown:
        raise ValueError(f"{where}: unknown server key(s) {unknown}; allowed: command, args, env, cwd")
    command = server.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ValueError(f'{where}: server["command"] must be a non-empty string, got {command!r}')
    args = server.get("args", [])
    if not isinstance(args, list | tuple) or not all(isinstance(a, str) for a in args):
        raise ValueError(f'{where}: server["args"] must be a list of strings, got {args!r}')
    env = server.get("env")
    if env is not None and (
        not isinstance(env, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError(f'{where}: server["env"] must be a dict of strings to strings, got {env!r}')
    cwd = server.get("cwd")
    if cwd is not None and not isinstance(cwd, str | os.PathLike):
        raise ValueError(f'{where}: server["cwd"] must be a path string, got {cwd!r}')
    return {
        "command": command,
        "args": list(args),
        "env": dict(env) if env is not None else None,
        "cwd": os.fspath(cwd) if cwd is not None else None,
    }


def check_headers(where: str, headers: Any) -> dict[str, str] | None:
    if headers is None:
        return None
    if not isinstance(headers, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise ValueError(f"{where}: headers must be a dict of strings to strings, got {headers!r}")
    return dict(headers)


def check_url(where: str, url: Any) -> str:
    from urllib.parse import urlparse

    if not isinstance(url, str) or urlparse(url).scheme not in ("http", "https") or not urlparse(url).netloc:
        raise ValueError(f"{where}: url must be an http:// or https:// URL, got {url!r}")
    return url


@dataclass(frozen=True)
class MCPServerConfig:
    """One validated entry of ``mcp_servers`` (see the module doc).

    ``name`` is the key (the tools' name prefix); ``transport`` ``"stdio"`` or
    ``"http"``; ``stdio`` the command / args / env / cwd, or ``url`` /
    ``headers`` / ``auth_provider``; timeouts in seconds.
    """

    name: str
    transport: Literal["stdio", "http"]
    stdio: dict[str, Any] | None = None
    url: str | None = None
    headers: dict[str, str] | None = None
    auth_provider: Any = field(default=None, compare=False)
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_SECONDS
    call_timeout: float = DEFAULT_CALL_TIMEOUT_SECONDS

    def key(self) -> tuple[Any, ...]:
        """What makes two entries the same server (one pooled connection per key and loop)."""
        stdio = self.stdio or {}
        return (
            self.name,
            self.transport,
            stdio.get("command"),
            tuple(stdio.get("args") or ()),
            tuple(sorted((stdio.get("env") or {}).items())),
            stdio.get("cwd"),
            self.url,
            tuple(sorted((self.headers or {}).items())),
            id(self.auth_provider) if self.auth_provider is not None else None,
            self.connect_timeout,
            self.call_timeout,
        )


def _as_mapping(value: Any) -> Mapping[str, Any] | None:
    if isinstance(value, Mapping):
        return value
    if isinstance(getattr(value, "command", None), str) and hasattr(
        value, "args"
    ):  # mcp.StdioServerParameters
        return {
            "command": value.command,
            "args": list(value.args),
            "env": getattr(value, "env", None),
            "cwd": getattr(value, "cwd", None),
        }
    return None


def _one_server(name: Any, value: Any) -> MCPServerConfig:
    if not isinstance(name, str) or not SERVER_NAME_PATTERN.match(name):
        raise ValueError(
            f"the server name {name!r} must be 1-32 letters, digits, '_' or '-' (it prefixes the tool names)"
        )
    where = f'mcp_servers["{name}"]'
    server = _as_mapping(value)
    if server is None:
        raise ValueError(
            f"{where} must be a dict or an mcp.StdioServerParameters, got {type(value).__name__}"
        )
    kind = server.get("type", "http" if "url" in server else "stdio")
    timeouts = {
        key: positive_seconds(where, key, server[key])
        for key in ("connect_timeout", "call_timeout")
        if key in server
    }
    if kind == "stdio":
        stdio = check_stdio_server(where, server, extra=_COMMON_KEYS)
        return MCPServerConfig(name=name, transport="stdio", stdio=stdio, **timeouts)
    if kind in ("http", "streamable_http", "streamable-http"):
        unknown = sorted(set(server) - _HTTP_KEYS - _COMMON_KEYS)
        if unknown:
            raise ValueError(
                f"{where}: unknown server key(s) {unknown}; allowed: type, url, headers, auth_provider"
            )
        return MCPServerConfig(
            name=name,
            transport="http",
            url=check_url(where, server.get("url")),
            headers=check_headers(where, server.get("headers")),
            auth_provider=server.get("auth_provider"),
            **timeouts,
        )
    raise ValueError(f'{where}: "type" must be "stdio" or "http", got {kind!r}')


def validate_mcp_servers(value: Any) -> dict[str, MCPServerConfig] | None:
    """The ``mcp_servers`` option checked (``None`` stays ``None``); ``ValueError``
    naming the server and what is wrong."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError(f"mcp_servers must be a dict of server name to server, got {type(value).__name__}")
    return {name: _one_server(name, server) for name, server in value.items()}


__all__ = [
    "DEFAULT_CALL_TIMEOUT_SECONDS",
    "DEFAULT_CONNECT_TIMEOUT_SECONDS",
    "MCPServerConfig",
    "check_headers",
    "check_stdio_server",
    "check_url",
    "positive_seconds",
    "validate_mcp_servers",
]
