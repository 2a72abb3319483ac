"""Built-in workspace tools: ``Read``, ``Write``, ``Edit``, ``LS``, ``Glob``, ``Grep``, ``Bash``.

``create_agent`` installs them over the agent's private workspace
(``~/.agent/workspaces/<name>``, else ``~/.agent/workspaces/agent-<session id>``,
or the ``workspace`` option); :func:`create_builtin_tools` and
:func:`create_agent_workspace_tools` build them by hand (for
``create_bare_agent`` or your own assembly).

Inputs (paths relative to ``cwd`` unless absolute)::

    Read   {file_path, offset?: int (1-based line), limit?: int}
    Write  {file_path, content}                       # creates parent directories
    Edit   {file_path, old_string, new_string, replace_all?: bool}
    LS     {path?}
    Glob   {pattern, path?}
    Grep   {pattern (regex), path?, glob?}
    Bash   {command, timeout_ms?}

Bounds: ``Write``, ``Edit`` and the shell writes ``Bash`` recognises stay
inside ``allowed_directories`` (default ``[cwd]``), checked on resolved paths
(symbolic links followed); the read-only tools read anything the process may
read. Every refusal is an error ``tool_result`` naming the path and the rule.
The four read-only tools are concurrency-safe. Details: :mod:`.policy`,
:mod:`.files`, :mod:`.search`, :mod:`.shell`, :mod:`.shell_policy`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from ...errors import ConfigError
from ..tool import ToolDefinition
from .files import file_tools
from .policy import DEFAULT_BASH_TIMEOUT_MS, Workspace, default_workspace_dir
from .search import search_tools
from .shell import shell_tools

BUILTIN_TOOL_NAMES = ("Read", "Write", "Edit", "LS", "Glob", "Grep", "Bash")
"""The names of the built-in tools, in the order the factories return them."""


_BUILT: dict[Workspace, tuple[ToolDefinition, ...]] = {}
"""The built-in tools made per workspace (a frozen, hashable :class:`Workspace`):
the definitions hold nothing but the workspace, so every agent of one workspace
(a template member's fresh session per work item, each step of a worker) shares
them instead of making seven again (about 3% of a handoff's runtime CPU)."""


def _tools(ws: Workspace) -> list[ToolDefinition]:
    built = _BUILT.get(ws)
    if built is None:
        tools = {t.name: t for t in file_tools(ws) + search_tools(ws) + shell_tools(ws)}
        built = tuple(tools[name] for name in BUILTIN_TOOL_NAMES)
        if len(_BUILT) >= 256:
            _BUILT.clear()
        _BUILT[ws] = built
    return list(built)


def create_builtin_tools(
    *,
    cwd: str | os.PathLike[str],
    allowed_directories: Iterable[str | os.PathLike[str]] | None = None,
    bash_timeout_ms: int = DEFAULT_BASH_TIMEOUT_MS,
) -> list[ToolDefinition]:
    """The seven built-in tools working in ``cwd``.

    Args:
        cwd: the directory relative paths are resolved against (a relative one
            is taken relative to the current directory now). It must exist when
            a tool needs it; it is not created.
        allowed_directories: the directories ``Write``, ``Edit`` and shell writes
            may change (relative entries are relative to ``cwd``); default ``[cwd]``.
        bash_timeout_ms: the longest one ``Bash`` call may run, in milliseconds.

    Returns a new list of :class:`~lattice_worker.tools.tool.ToolDefinition`
    (``Read``, ``Write``, ``Edit``, ``LS``, ``Glob``, ``Grep``, ``Bash``), each with
    ``metadata={"builtin": True, "workspace": Workspace(...)}``. Nothing is
    touched on disk. Raises :class:`ConfigError` for an option of the wrong type.
    """
    ws = Workspace.build(
        "create_builtin_tools",
        cwd=cwd,
        allowed_directories=allowed_directories,
        bash_timeout_ms=bash_timeout_ms,
    )
    return _tools(ws)


def create_agent_workspace_tools(
    *,
    name: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    allowed_directories: Iterable[str | os.PathLike[str]] | None = None,
    bash_timeout_ms: int = DEFAULT_BASH_TIMEOUT_MS,
) -> list[ToolDefinition]:
    """The built-in tools over an agent workspace, created on the first tool call.

    ``cwd`` defaults to ``~/.agent/workspaces/<name>`` (``name`` one directory
    name), or ``~/.agent/workspaces/agent-<random id>`` without a name. The other
    options are those of :func:`create_builtin_tools`. Raises :class:`ConfigError`
    for a wrong option or a ``name`` that cannot be a directory name.
    """
    where = "create_agent_workspace_tools"
    if cwd is None:
        if name is not None and not isinstance(name, str):
            raise ConfigError(f'{where}: option "name" expects a string; got {name!r}')
        cwd = default_workspace_dir(where, name if name is not None else f"agent-{os.urandom(8).hex()}")
    ws = Workspace.build(
        where, cwd=cwd, allowed_directories=allowed_directories, bash_timeout_ms=bash_timeout_ms, create=True
    )
    return _tools(ws)


def builtin_workspace(tools: Iterable[ToolDefinition]) -> Workspace | None:
    """The :class:`Workspace` of the first built-in tool among ``tools``, or ``None``."""
    for t in tools:
        metadata = t.metadata or {}
        if metadata.get("builtin") is True and isinstance(metadata.get("workspace"), Workspace):
            return metadata["workspace"]
    return None


def _workspace_options(
    where: str, workspace: Any, name: str | None, session_id: str | None
) -> dict[str, Any]:
    if isinstance(workspace, str | os.PathLike):
        return {"cwd": workspace}
    if isinstance(workspace, Mapping):
        options = {k: v for k, v in workspace.items() if v is not None}
        return options
    if name is not None:
        return {"cwd": default_workspace_dir(where, name)}
    if session_id is None:
        return {}  # checked at definition time; the session id comes with the session
    return {"cwd": default_workspace_dir(where, f"agent-{session_id}")}


def check_agent_workspace(
    where: str, *, workspace: Any, name: str | None, tools: Iterable[ToolDefinition]
) -> None:
    """Raise :class:`ConfigError` when an agent with these options could not get its
    workspace tools: a ``name`` that cannot be a directory name, bad workspace
    options, or one of ``tools`` taking a built-in tool's name. Touches nothing on disk."""
    tools = list(tools)
    if builtin_workspace(tools) is not None:
        return
    options = _workspace_options(where, workspace, name, None)
    if "cwd" in options:
        Workspace.build(where, create=True, **options)
    taken = sorted({t.name for t in tools} & set(BUILTIN_TOOL_NAMES))
    if taken:
        raise ConfigError(
            f'{where}: the tool name "{taken[0]}" is taken by the built-in workspace tools; rename the tool, '
            "or pass workspace=False (or use create_bare_agent) for an agent without them"
        )


def agent_workspace_tools(
    where: str, *, workspace: Any, name: str | None, session_id: str, tools: Iterable[ToolDefinition]
) -> tuple[Workspace, list[ToolDefinition]]:
    """The workspace of a (non-bare) agent and the built-in tools to add to ``tools``.

    ``workspace``: ``None`` (the default location), a path (the ``cwd``) or a
    mapping with ``cwd``, ``allowed_directories``, ``bash_timeout_ms``. When
    ``tools`` already hold built-in tools (passed by hand, or carried over from
    another session of the same agent), their workspace is used and nothing is
    added. Raises :class:`ConfigError` like :func:`check_agent_workspace`.
    """
    tools = list(tools)
    existing = builtin_workspace(tools)
    if existing is not None:
        return existing, []
    check_agent_workspace(where, workspace=workspace, name=name, tools=tools)
    options = _workspace_options(where, workspace, name, session_id)
    ws = Workspace.build(where, create=True, **options)
    return ws, _tools(ws)


__all__ = [
    "BUILTIN_TOOL_NAMES",
    "Workspace",
    "agent_workspace_tools",
    "builtin_workspace",
    "check_agent_workspace",
    "create_agent_workspace_tools",
    "create_builtin_tools",
]
