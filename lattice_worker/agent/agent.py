"""``Agent`` and its factories (docs/architecture.md, "Core model";
options: docs/configure.md, "What is configured in code").

One :class:`Agent` holds one conversation. Create it with :func:`create_agent`,
:func:`create_bare_agent` or :meth:`AgentSpec.spawn` (from :func:`define_agent`).

``create_agent`` vs ``create_bare_agent``: ``create_agent`` gives the agent a
private workspace -- the built-in tools ``Read``, ``Write``, ``Edit``, ``LS``,
``Glob``, ``Grep`` and ``Bash`` (:mod:`lattice_worker.tools.builtin`) working in
``~/.agent/workspaces/<name>`` (``agent-<session id>`` without a name, or the
``workspace`` option), created on the first tool call -- and default
system-prompt sections: where the workspace is and what it may write, and,
when tools can run concurrently, a note asking the model to batch independent
calls. A bare agent (``create_bare_agent``, or ``workspace=False`` on
``create_agent`` / ``define_agent``) has only the tools you pass and sends
exactly the ``system_prompt`` you gave (plus matched skills). Built-in tools
passed in ``tools`` (``create_builtin_tools(...)``) replace the default set.
Each ``AgentSpec.spawn()`` session gets its own workspace tools; sessions of a
named spec share the directory ``~/.agent/workspaces/<name>``.

Skills (``skills=[...]``, :mod:`lattice_worker.tools.skills`) are matched
against each query's prompt; the matched ones' instructions are appended to
the system prompt of that query's requests only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ..errors import ConcurrentQueryError, ConfigError
from ..tools.builtin import Workspace, agent_workspace_tools, check_agent_workspace
from ..tools.skills import match_skills, skills_prompt_section
from ..tools.tool import ToolDefinition
from ..tools.tool_search import DeferredTools
from .events import ResultMessage, SDKMessage
from .loop import RunControl, _copy, run_query
from .options import (
    AgentOptions,
    WorkspaceOptions,
    check_tool_set,
    validate_agent_options,
    validate_query_options,
)
from .output import build_submit_output_tool

logger = logging.getLogger("lattice_worker.agent")

CONCURRENCY_PROMPT = (
    "Some of your tools can run at the same time. When several tool calls are independent of each "
    "other, put them in one response; when a call needs an earlier call's result, make it in a later "
    "response."
)


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _check_prompt(where: str, prompt: Any) -> None:
    if prompt is None:
        return
    if isinstance(prompt, str):
        if not prompt.strip():
            raise ConfigError(f"{where}: the prompt is empty")
        return
    if isinstance(prompt, list):
        if not prompt:
            raise ConfigError(f"{where}: the prompt is an empty list of content blocks")
        for i, block in enumerate(prompt):
            if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                raise ConfigError(f'{where}: prompt item {i} is not a content block (a dict with a "type")')
        return
    raise ConfigError(
        f"{where}: the prompt must be a str, a list of content blocks, or None (continue from history); "
        f"got {type(prompt).__name__}"
    )


def _workspace_option(options: AgentOptions) -> Any:
    """The ``workspace`` option as the built-in tools take it: ``None``, a path or a dict."""
    workspace = options.workspace
    return workspace.model_dump() if isinstance(workspace, WorkspaceOptions) else workspace


def _prompt_text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return " ".join(
            b["text"] for b in prompt if b.get("type") == "text" and isinstance(b.get("text"), str)
        )
    return ""


def _message_problem(message: Any) -> str | None:
    """What is wrong with the shape of one history message, or ``None``."""
    if not isinstance(message, dict):
        return f"is {type(message).__name__}, not a message dict"
    if message.get("role") not in ("user", "assistant"):
        return f'needs "role" "user" or "assistant", got {message.get("role")!r}'
    if "content" not in message:
        return 'has no "content"'
    content = message["content"]
    if isinstance(content, str):
        return None
    if isinstance(content, list) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in content
    ):
        return None
    return f'has "content" that is neither a str nor a list of content blocks (dicts with a "type"): {content!r:.120}'


class Agent:
    """One conversation with a model, plus its tools.

    Create with :func:`create_agent` / :func:`create_bare_agent` / ``AgentSpec.spawn()``;
    the constructor is internal. Attributes: ``session_id`` (a fresh UUID string),
    ``name``, ``options`` (the validated :class:`AgentOptions`), ``output_schema``,
    ``tools`` (a copy of the registered tools, ``submit_output`` excluded).
    """

    def __init__(self, options: AgentOptions, *, bare: bool = False, session_id: str | None = None) -> None:
        self.options = options
        self.session_id = session_id or str(uuid.uuid4())
        self._bare = bare
        self._tools: dict[str, ToolDefinition] = {t.name: t for t in options.tools}
        self._mcp_tools: dict[str, ToolDefinition] = {}
        self._workspace: Workspace | None = None
        if not bare:
            self._workspace, builtin = agent_workspace_tools(
                "create_agent",
                workspace=_workspace_option(options),
                name=options.name,
                session_id=self.session_id,
                tools=options.tools,
            )
            self._tools.update((t.name, t) for t in builtin)
        self.deferred_tools = DeferredTools(self._tools.values())
        self._submit_tool = (
            build_submit_output_tool(options.output_schema) if options.output_schema is not None else None
        )
        self._history: list[dict[str, Any]] = []
        self._history_loaded = options.history_store is None
        self._control: RunControl | None = None
        # Held for the whole of a query (and by replace_history): one conversation at a
        # time across threads and event loops, acquired without blocking.
        self._query_lock = threading.Lock()
        self._context_tokens: int | None = None  # input tokens the last model response reported
        self._lazy_client: Any = None
        self._lazy_client_loop: Any = None

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r}, session_id={self.session_id!r}, bare={self._bare})"

    # ---------------------------------------------------------------- properties

    @property
    def name(self) -> str | None:
        """The ``name`` option (used as the trace source name), or ``None``."""
        return self.options.name

    @property
    def output_schema(self) -> Any:
        """The ``output_schema`` option (read-only), or ``None``."""
        return self.options.output_schema

    @property
    def bare(self) -> bool:
        """True for agents from ``create_bare_agent`` (or ``workspace=False``)."""
        return self._bare

    @property
    def workspace(self) -> Workspace | None:
        """The workspace of the built-in tools (``cwd``, ``allowed_directories``,
        ``bash_timeout_ms``), or ``None`` for a bare agent."""
        return self._workspace

    @property
    def tools(self) -> list[ToolDefinition]:
        """The registered tools in registration order (``submit_output`` not included)."""
        return list(self._tools.values())

    @property
    def running(self) -> bool:
        """True while a query of this Agent is running."""
        return self._query_lock.locked()

    # ------------------------------------------------------------------ tools

    def add_tools(self, tools: Iterable[ToolDefinition]) -> None:
        """Register more tools (the team runtime adds member tools to its lead).

        Takes effect from the next model request. Raises :class:`ConfigError` for a
        non-``ToolDefinition`` item, a name already registered, or ``submit_output``
        while ``output_schema`` is set; on error nothing is added.
        """
        new = list(tools)
        for i, t in enumerate(new):
            if not isinstance(t, ToolDefinition):
                raise ConfigError(f"add_tools: item {i} is {type(t).__name__}, not a ToolDefinition")
        check_tool_set(list(self._tools.values()) + new, output_schema=self.output_schema, where="add_tools")
        for t in new:
            self._tools[t.name] = t
        if any(t.defer for t in new):
            self.deferred_tools.update(self._tools.values())

    def _tool_map(self) -> dict[str, ToolDefinition]:
        """Every tool a call may name: the registered ones, this query's MCP tools,
        ``tool_search`` while anything is deferred, ``submit_output`` with an output schema."""
        search = self.deferred_tools.search_tool
        if self._submit_tool is None and not self._mcp_tools and search is None:
            return self._tools
        extra = {t.name: t for t in (search, self._submit_tool) if t is not None}
        return {**self._tools, **self._mcp_tools, **extra}

    def _request_tools(self) -> list[ToolDefinition]:
        """The tools the next model request offers: deferred tools only once loaded."""
        return self.deferred_tools.visible(self._tool_map().values())

    async def _prepare_mcp_tools(self) -> None:
        """Resolve the ``mcp_servers`` option into this query's MCP tools (pooled
        connections of this process and event loop; see
        :mod:`lattice_worker.tools.mcp_servers`). Raises :class:`ConfigError` when
        an MCP tool's name collides with another tool."""
        servers = self.options.mcp_servers
        if not servers:
            return
        # imported here: the mcp SDK costs about a second to import, paid only by agents using it
        from ..tools.mcp.pool import mcp_server_tools

        tools = await mcp_server_tools(servers)
        check_tool_set(
            list(self._tools.values()) + tools, output_schema=self.output_schema, where="mcp_servers"
        )
        self._mcp_tools = {t.name: t for t in tools}
        if any(t.defer for t in tools):
            self.deferred_tools.update([*self._tools.values(), *tools])

    def _skills_section(self, prompt: Any) -> str | None:
        """The system-prompt section of the skills a query's prompt matches (or ``None``).
        For ``query(None)`` the prompt is the text of the history's last user message."""
        skills = self.options.skills
        if not skills:
            return None
        if prompt is None:
            prompt = next((m["content"] for m in reversed(self._history) if m.get("role") == "user"), "")
        return skills_prompt_section(match_skills(skills, _prompt_text(prompt)))

    def _system_prompt(self, skills: str | None = None) -> str | None:
        prompt = self.options.system_prompt
        if self._bare:
            if skills is None:
                return prompt
            return f"{prompt}\n\n{skills}" if prompt else skills
        sections = [prompt] if prompt else []
        if self._workspace is not None:
            builtin = [t.name for t in self._tools.values() if (t.metadata or {}).get("builtin") is True]
            sections.append(self._workspace.describe(builtin))
        mode = self.options.tool_concurrency.mode
        if len(self._tools) > 1 and (
            mode == "all"
            or (
                mode == "safe"
                and any(
                    t.concurrent or t.is_concurrency_safe not in (None, False) for t in self._tools.values()
                )
            )
        ):
            sections.append(CONCURRENCY_PROMPT)
        if skills is not None:
            sections.append(skills)
        return "\n\n".join(sections) if sections else None

    def _model_client(self) -> Any:
        if self.options.model_client is not None:
            return self.options.model_client
        loop = asyncio.get_running_loop()
        if self._lazy_client is None or self._lazy_client_loop is not loop:
            # Imported lazily: the Anthropic client is optional for scripted/custom clients,
            # and its HTTP pool is bound to one event loop (prompt_sync runs a new loop per call).
            from .anthropic_client import AnthropicModelClient

            self._lazy_client = AnthropicModelClient(
                api_key=self.options.api_key, base_url=self.options.base_url
            )
            self._lazy_client_loop = loop
        return self._lazy_client

    # ---------------------------------------------------------------- history

    def _store_failed(self, action: str, exc: BaseException) -> None:
        store = self.options.history_store
        if getattr(store, "fail_on_error", False):
            raise exc
        logger.warning("history store %s failed; continuing in memory", action, exc_info=exc)

    async def _ensure_history_loaded(self) -> None:
        if self._history_loaded:
            return
        store = self.options.history_store
        try:
            loaded = await _maybe_await(store.load())
            if loaded is None:
                loaded = []
            if not isinstance(loaded, list) or not all(isinstance(m, dict) for m in loaded):
                raise TypeError(
                    f"history store load() returned {type(loaded).__name__}, not a list of message dicts"
                )
        except Exception as exc:
            self._store_failed("load", exc)
            loaded = []
        self._history = list(loaded) + self._history
        self._history_loaded = True
        self.deferred_tools.note_history(self._history)

    async def _append(self, message: dict[str, Any]) -> None:
        self._history.append(message)
        store = self.options.history_store
        if store is not None:
            try:
                await _maybe_await(store.append(_copy(message)))
            except Exception as exc:
                self._store_failed("append", exc)

    async def get_history(self) -> list[dict[str, Any]]:
        """A deep copy of the conversation (Anthropic wire-format message dicts),
        including what the history store held (loaded on first use)."""
        if not self._query_lock.locked():
            await self._ensure_history_loaded()
        return _copy(self._history)

    async def replace_history(self, messages: list[dict[str, Any]]) -> None:
        """Replace the whole conversation (and the history store's copy).

        ``messages``: a list of Anthropic wire-format message dicts. Idle only:
        raises :class:`ConcurrentQueryError` while a query runs. Only the shape is
        checked -- each message a dict with ``role`` ``"user"`` or ``"assistant"``
        and ``content`` a str or a list of content blocks (dicts with a string
        ``type``); anything else raises :class:`ConfigError` and changes nothing
        (neither the history nor the store). The content is the host's: it must be
        a well-formed history (every ``tool_use`` answered by its ``tool_result``).
        """
        if not self._query_lock.acquire(blocking=False):
            raise ConcurrentQueryError("replace_history() is idle-only: this Agent is running a query")
        try:
            await self._replace_history(messages)
        finally:
            self._query_lock.release()

    async def _replace_history(self, messages: list[dict[str, Any]]) -> None:
        if not isinstance(messages, list):
            raise ConfigError(
                f"replace_history: messages must be a list of message dicts, got {type(messages).__name__}"
            )
        for i, message in enumerate(messages):
            problem = _message_problem(message)
            if problem is not None:
                raise ConfigError(f"replace_history: messages[{i}] {problem}")
        await self._rewrite_history(_copy(messages))
        self._history_loaded = True
        self.deferred_tools.note_history(self._history, replace=True)

    async def _rewrite_history(self, messages: list[dict[str, Any]]) -> None:
        """Replace the whole history (compaction, replace_history): the store's
        ``replace`` first (a ``fail_on_error`` store's error propagates and the
        history stays as it was), then the in-memory list."""
        store = self.options.history_store
        if store is not None:
            try:
                await _maybe_await(store.replace(_copy(messages)))
            except Exception as exc:
                self._store_failed("replace", exc)
        self._history = messages

    # ---------------------------------------------------------------- queries

    def query(self, prompt: Any, /, **query_options: Any) -> AsyncIterator[SDKMessage]:
        """Run the agent loop on ``prompt``; an async iterator of SDK events
        (``system``, ``stream_event``, ``assistant``, ``user``, then one ``result``).

        ``prompt``: a str, a list of content blocks (multimodal), or ``None`` to
        continue from the stored history (which must end with a user message).
        ``query_options``: see :class:`~lattice_worker.agent.options.QueryOptions`.

        Raises :class:`ConfigError` at once for bad options or prompt;
        :class:`ConcurrentQueryError` on first iteration while another query of this
        Agent runs. Close an abandoned iteration with ``contextlib.aclosing`` (or
        ``await it.aclose()``) so the Agent is released immediately.
        """
        _check_prompt("query", prompt)
        options = validate_query_options("query", query_options)
        return run_query(self, prompt, options)

    async def prompt(self, prompt: Any, /, **query_options: Any) -> ResultMessage:
        """Run the loop and return only the final :class:`ResultMessage`.

        Error subtypes are returned, not raised (see ``ResultMessage.raise_for_error``);
        :class:`ConcurrentQueryError` and exceptions from hooks (and ``fail_on_error``
        stores/tracers) are raised.
        """
        _check_prompt("prompt", prompt)
        options = validate_query_options("prompt", query_options)
        result: ResultMessage | None = None
        gen = run_query(self, prompt, options)
        try:
            async for event in gen:
                if isinstance(event, ResultMessage):
                    result = event
        finally:
            await gen.aclose()
        if result is None:  # pragma: no cover - the loop always ends with a result
            raise RuntimeError("the agent loop ended without a result")
        return result

    def prompt_sync(self, prompt: Any, /, **query_options: Any) -> ResultMessage:
        """Blocking :meth:`prompt` for synchronous callers (runs its own event loop).

        Raises ``RuntimeError`` when called from a thread whose event loop is
        running -- use ``await agent.prompt(...)`` there.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError(
                "prompt_sync() cannot run inside a running event loop; use `await agent.prompt(...)` instead"
            )
        _check_prompt("prompt_sync", prompt)
        validate_query_options("prompt_sync", query_options)
        return asyncio.run(self.prompt(prompt, **query_options))

    def interrupt(self) -> bool:
        """End the running query with subtype ``"interrupted"`` (``is_error`` false).

        The in-flight model turn is dropped; a running tool batch finishes and its
        results are recorded first. Returns True when a query was running, False
        when idle (a no-op). A query counts as running from its first iteration
        (``async for`` / ``await prompt(...)`` started), not from the ``query()``
        call. Safe to call from another thread.
        """
        control = self._control
        if control is None:
            return False
        control.interrupt()
        return True


class AgentSpec:
    """A stateless agent template from :func:`define_agent`.

    ``options`` is the validated :class:`AgentOptions`; :meth:`spawn` creates an
    independent :class:`Agent` (own session id and history) from it.
    """

    __slots__ = ("options",)

    def __init__(self, options: AgentOptions) -> None:
        self.options = options

    @property
    def name(self) -> str | None:
        return self.options.name

    @property
    def output_schema(self) -> Any:
        return self.options.output_schema

    def spawn(self) -> Agent:
        """A fresh :class:`Agent` session: its own session id, history and workspace
        tools (bare when ``workspace=False``). Raises :class:`ConfigError` when the
        default workspace cannot be named (see :func:`define_agent`)."""
        return Agent(self.options, bare=self.options.workspace is False)

    def __repr__(self) -> str:
        return f"AgentSpec(name={self.options.name!r})"


def create_agent(**options: Any) -> Agent:
    """Create an :class:`Agent` (options: lattice_worker.agent.options.AgentOptions, keyword-only).

    Raises :class:`ConfigError` naming an unknown option key or an option of the
    wrong type, on duplicate tool names, or a tool named ``submit_output`` while
    ``output_schema`` is set. See the module doc for create_agent vs create_bare_agent.
    """
    validated = validate_agent_options("create_agent", options)
    return Agent(validated, bare=validated.workspace is False)


def create_bare_agent(**options: Any) -> Agent:
    """Create a bare :class:`Agent`: no built-in workspace tools, no workspace
    directory, no default prompt section. Same options as :func:`create_agent`
    minus ``workspace``; raises :class:`ConfigError` like it."""
    validated = validate_agent_options("create_bare_agent", options, allow_workspace=False)
    return Agent(validated, bare=True)


def define_agent(**options: Any) -> AgentSpec:
    """Create an :class:`AgentSpec` template; ``spec.spawn()`` makes sessions.

    Raises :class:`ConfigError` like :func:`create_agent` (the workspace options
    and tool names included); nothing is created on disk.
    """
    validated = validate_agent_options("define_agent", options)
    if validated.workspace is not False:
        check_agent_workspace(
            "define_agent",
            workspace=_workspace_option(validated),
            name=validated.name,
            tools=validated.tools,
        )
    return AgentSpec(validated)


def is_agent_spec(value: Any) -> bool:
    """True when ``value`` is an :class:`AgentSpec` (a template), not a live session."""
    return isinstance(value, AgentSpec)


__all__ = [
    "Agent",
    "AgentSpec",
    "create_agent",
    "create_bare_agent",
    "define_agent",
    "is_agent_spec",
]
