"""Agent and query options, validated strictly (docs/configure.md, "What is
configured in code").

Options are keyword-only. An unknown key raises :class:`ConfigError` naming it;
a value of the wrong type raises :class:`ConfigError` naming the option and what
it expects. Validation is pydantic's (strict scalars: ``"5"`` is not an int,
``True`` is not an int).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictBool,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from ..errors import ConfigError
from ..tools.mcp_servers import validate_mcp_servers
from ..tools.skills import check_skills
from ..tools.tool import ToolDefinition
from ..tools.tool_search import TOOL_SEARCH_NAME
from .abort import AbortSignal
from .hooks import AgentHooks, coerce_hooks
from .model import MIN_THINKING_BUDGET_TOKENS, capped_thinking_budget
from .output import SUBMIT_OUTPUT_TOOL_NAME, is_output_schema
from .result_limits import DEFAULT_MAX_TOOL_RESULT_CHARS

PositiveInt = Annotated[int, Strict(), Field(gt=0)]
NonNegativeInt = Annotated[int, Strict(), Field(ge=0)]

DEFAULT_MAX_TOKENS = 4096
"""Output budget per model request when ``max_tokens`` is not set."""

DEFAULT_MAX_TURNS = 50

UNKNOWN_OPTION_HINT = (
    "Check for a typo, or upgrade agent-lattice if this option was added in a newer version."
)


class ToolConcurrencyOptions(BaseModel):
    """``tool_concurrency`` (docs/tool-effects.md, "How concurrency fits together").

    ``mode``: ``"safe"`` (default; consecutive calls whose tool says
    ``is_concurrency_safe(input)`` overlap), ``"all"`` (every call may overlap) or
    ``"sequential"``. ``max_concurrency``: positive int, default 10.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["safe", "all", "sequential"] = "safe"
    max_concurrency: PositiveInt = 10


class AutoCompactOptions(BaseModel):
    """``auto_compact`` settings (``auto_compact=True`` means all the defaults).

    ``threshold_tokens``: compact between turns once a response reported more
    input tokens than this (positive int, default 100,000). ``keep_recent_messages``:
    how many of the latest messages stay as they are (int >= 0, default 6; more
    are kept when the cut would separate a ``tool_result`` from its ``tool_use``).
    ``prompt``: the summarisation instruction (default
    :data:`~lattice_worker.agent.compaction.DEFAULT_COMPACTION_PROMPT`).
    ``model`` / ``max_tokens``: for the summary request (default: the agent's).
    See :mod:`lattice_worker.agent.compaction`. Raises :class:`ConfigError` (via
    the agent factories) on an unknown key or a bad value.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    threshold_tokens: PositiveInt = 100_000
    keep_recent_messages: NonNegativeInt = 6
    prompt: StrictStr | None = None
    model: StrictStr | None = None
    max_tokens: PositiveInt | None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("prompt must not be blank")
        return v


class WorkspaceOptions(BaseModel):
    """``workspace`` as an object: ``cwd`` (the workspace directory),
    ``allowed_directories`` (write roots, default ``[cwd]``), ``bash_timeout_ms``
    (milliseconds, default 120 000). See :mod:`lattice_worker.tools.builtin`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cwd: StrictStr
    allowed_directories: list[StrictStr] | None = None
    bash_timeout_ms: PositiveInt | None = None


def _workspace_options(value: Mapping[str, Any]) -> WorkspaceOptions:
    """``workspace`` given as a dict: paths may be ``os.PathLike``; a ``ValueError``
    says which key is wrong (the union's own error would only say "not a string")."""
    given = dict(value)
    if isinstance(given.get("cwd"), os.PathLike):
        given["cwd"] = os.fspath(given["cwd"])
    if isinstance(given.get("allowed_directories"), list | tuple):
        given["allowed_directories"] = [
            os.fspath(d) if isinstance(d, os.PathLike) else d for d in given["allowed_directories"]
        ]
    try:
        return WorkspaceOptions.model_validate(given)
    except ValidationError as exc:
        problems = [
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}" for e in exc.errors(include_url=False)
        ]
        raise ValueError("; ".join(problems)) from None


def _check_thinking(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ValueError("not a dict")
    kind = value.get("type")
    if kind in ("adaptive", "disabled"):
        if set(value) != {"type"}:
            raise ValueError(f'type "{kind}" takes no other keys')
        return {"type": kind}
    if kind == "enabled":
        budget = value.get("budget_tokens")
        if (
            set(value) != {"type", "budget_tokens"}
            or not isinstance(budget, int)
            or isinstance(budget, bool)
            or budget <= 0
        ):
            raise ValueError('type "enabled" needs a positive integer "budget_tokens" and nothing else')
        if budget < MIN_THINKING_BUDGET_TOKENS:
            raise ValueError(
                f"budget_tokens={budget} is below the provider's minimum of {MIN_THINKING_BUDGET_TOKENS}"
            )
        return {"type": "enabled", "budget_tokens": budget}
    raise ValueError(f"unknown thinking type {kind!r}")


def _check_output_format(value: Any) -> Any:
    if value is None or value == "json":
        return value
    if (
        isinstance(value, Mapping)
        and value.get("type") == "json_schema"
        and isinstance(value.get("schema"), Mapping)
    ):
        if set(value) - {"type", "schema", "name", "strict"}:
            raise ValueError("unknown keys")
        return dict(value)
    raise ValueError("not an output format")


def _has_methods(value: Any, *names: str) -> bool:
    return all(callable(getattr(value, n, None)) for n in names)


_AGENT_EXPECTED: dict[str, str] = {
    "api_key": "a string",
    "base_url": "a string (an Anthropic-compatible endpoint URL)",
    "name": "a string",
    "model": "a string (the model name)",
    "system_prompt": "a string",
    "max_tokens": "a positive integer",
    "max_turns": "a positive integer (model requests per query)",
    "thinking_config": '{"type": "adaptive"}, {"type": "enabled", "budget_tokens": N >= 1024} or {"type": "disabled"}',
    "reasoning_effort": '"low", "high" or "max"',
    "request_timeout_ms": "a positive integer number of milliseconds",
    "output_schema": "a pydantic BaseModel subclass or an object with a parse(value) method",
    "tools": "a list of ToolDefinition (built with tool())",
    "mcp_servers": 'a dict of server name to {"command", "args"?, ...} (stdio) or {"type": "http", "url", ...}',
    "tool_batch_policy": "an object with validate(ctx), or a callable(ctx)",
    "hooks": "AgentHooks(on_tool_result=..., on_model_request=...) or a dict of those",
    "auto_compact": "True/False, AutoCompactOptions, or a dict with threshold_tokens, keep_recent_messages, "
    "prompt, model, max_tokens",
    "max_tool_result_chars": "a positive integer number of characters, or None for no bound",
    "tool_concurrency": '{"mode": "safe" | "all" | "sequential", "max_concurrency": positive int}',
    "skills": "a list of skills (skill(...) or load_skill(path)) with unique names",
    "workspace": "a directory path, False, or a dict with cwd, allowed_directories, bash_timeout_ms",
    "permission": "a callable(request) returning {'behavior': 'allow'} or {'behavior': 'deny', 'message': ...}",
    "permission_mode": '"allow" (every registered tool may run) or "by_effect" (calls of tools that are not '
    "read_only need an approval)",
    "model_client": (
        "a ModelClient (an object with async create_message(request)), or a function(request) returning "
        "an AssistantModelMessage (wrapped in ScriptedModelClient); pass an instance, not a class"
    ),
    "tracer": "a ContextTracer (an object with on_event(event))",
    "history_store": "a HistoryStore (an object with load(), append(message), replace(messages))",
}

_QUERY_EXPECTED: dict[str, str] = {
    "stream": "True or False",
    "output_format": '"json" or {"type": "json_schema", "schema": {...}}',
    "thinking_config": _AGENT_EXPECTED["thinking_config"],
    "reasoning_effort": _AGENT_EXPECTED["reasoning_effort"],
    "request_timeout_ms": _AGENT_EXPECTED["request_timeout_ms"],
    "signal": "an AbortSignal (AbortController().signal or AbortSignal.timeout(seconds))",
    "tracer": _AGENT_EXPECTED["tracer"],
    "runtime": "a runtime object (optional async after_tool_batch(outcome))",
    "trace_context": "a lattice_worker.tracing.base.TraceContext",
}


class AgentOptions(BaseModel):
    """Options of ``create_agent`` / ``create_bare_agent`` / ``define_agent``
    (docs/architecture.md, "Public API").

    See the module doc for strictness. ``skills``: see
    :mod:`lattice_worker.tools.skills`; ``workspace`` (a directory, ``False`` or
    :class:`WorkspaceOptions`): see :mod:`lattice_worker.tools.builtin`;
    ``create_bare_agent`` does not accept ``workspace``. Units:
    ``request_timeout_ms`` is milliseconds, ``max_tool_result_chars`` characters.

    ``auto_compact``: ``True`` or :class:`AutoCompactOptions` (or its dict)
    turns on context compaction (:mod:`lattice_worker.agent.compaction`).
    ``max_tool_result_chars``: the most text one tool result may carry before it
    is cut with a note (default :data:`DEFAULT_MAX_TOOL_RESULT_CHARS`, 100,000;
    ``None``: no bound; see :mod:`lattice_worker.agent.result_limits`).
    ``thinking_config`` ``{"type": "enabled", "budget_tokens": N}``: ``N`` is
    capped at ``max_tokens - 1`` on every request; a budget (or a cap) below
    1,024, the provider's minimum, raises :class:`ConfigError`.
    ``mcp_servers`` (Python only): MCP servers whose tools each query offers
    beside ``tools``, connected lazily per process and event loop
    (:mod:`lattice_worker.tools.mcp_servers`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    api_key: StrictStr | None = None
    base_url: StrictStr | None = None
    name: StrictStr | None = None
    model: StrictStr | None = None
    system_prompt: StrictStr | None = None
    max_tokens: PositiveInt | None = None
    max_turns: PositiveInt = DEFAULT_MAX_TURNS
    thinking_config: Any = None
    reasoning_effort: Literal["low", "high", "max"] | None = None
    request_timeout_ms: PositiveInt | None = None
    output_schema: Any = None
    tools: list[Any] = Field(default_factory=list)
    mcp_servers: Any = None
    tool_batch_policy: Any = None
    hooks: Any = None
    auto_compact: StrictBool | AutoCompactOptions | None = None
    max_tool_result_chars: PositiveInt | None = DEFAULT_MAX_TOOL_RESULT_CHARS
    tool_concurrency: ToolConcurrencyOptions = Field(default_factory=ToolConcurrencyOptions)
    skills: list[Any] | None = None
    workspace: StrictStr | Literal[False] | WorkspaceOptions | None = None
    permission: Callable[..., Any] | None = None
    permission_mode: Literal["allow", "by_effect"] = "allow"
    model_client: Any = None
    tracer: Any = None
    history_store: Any = None

    @field_validator("thinking_config", mode="before")
    @classmethod
    def _thinking(cls, v: Any) -> Any:
        return _check_thinking(v)

    @field_validator("auto_compact", mode="before")
    @classmethod
    def _auto_compact(cls, v: Any) -> Any:
        if isinstance(v, Mapping):
            try:
                return AutoCompactOptions(**v)
            except ValidationError as exc:
                first = exc.errors(include_url=False)[0]
                field = ".".join(str(p) for p in first.get("loc", ())) or "auto_compact"
                raise ValueError(f"{field}: {first.get('msg')}") from None
        return v

    @field_validator("workspace", mode="before")
    @classmethod
    def _workspace(cls, v: Any) -> Any:
        if isinstance(v, os.PathLike):
            return os.fspath(v)
        if v is True:
            raise ValueError("True is not a workspace")
        if isinstance(v, int | float) and not isinstance(v, bool):
            raise ValueError("a number is not a workspace")  # 0 == False would make a bare agent
        if isinstance(v, Mapping):
            return _workspace_options(v)
        return v

    @field_validator("skills", mode="before")
    @classmethod
    def _skills(cls, v: Any) -> Any:
        return check_skills(v)

    @field_validator("output_schema")
    @classmethod
    def _output_schema(cls, v: Any) -> Any:
        if v is not None and not is_output_schema(v):
            raise ValueError("not an output schema")
        return v

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: list[Any]) -> list[Any]:
        for i, t in enumerate(v):
            if not isinstance(t, ToolDefinition):
                raise ValueError(f"item {i} is {type(t).__name__}, not a ToolDefinition")
        return v

    @field_validator("mcp_servers")
    @classmethod
    def _mcp_servers(cls, v: Any) -> Any:
        return validate_mcp_servers(v)

    @field_validator("tool_batch_policy")
    @classmethod
    def _policy(cls, v: Any) -> Any:
        if v is not None and not (callable(getattr(v, "validate", None)) or callable(v)):
            raise ValueError("not a tool batch policy")
        return v

    @field_validator("hooks")
    @classmethod
    def _hooks(cls, v: Any) -> AgentHooks | None:
        try:
            return coerce_hooks(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("model_client")
    @classmethod
    def _client(cls, v: Any) -> Any:
        if v is None or (_has_methods(v, "create_message") and not inspect.isclass(v)):
            return v
        if inspect.isclass(v):
            raise ValueError(f"{v.__name__} is a class: pass an instance")
        if callable(v):  # a plain function(request) -> AssistantModelMessage, sync or async
            from .scripted import ScriptedModelClient

            return ScriptedModelClient(v)
        raise ValueError("no create_message method")

    @field_validator("tracer")
    @classmethod
    def _tracer(cls, v: Any) -> Any:
        if v is not None and not _has_methods(v, "on_event"):
            raise ValueError("no on_event method")
        return v

    @field_validator("history_store")
    @classmethod
    def _store(cls, v: Any) -> Any:
        if v is not None and not _has_methods(v, "load", "append", "replace"):
            raise ValueError("needs load, append and replace methods")
        return v

    @model_validator(mode="after")
    def _tool_set(self) -> AgentOptions:
        check_tool_set(self.tools, output_schema=self.output_schema, where=None)
        thinking_budget(self.thinking_config, self.max_tokens)
        return self

    @property
    def compaction(self) -> AutoCompactOptions | None:
        """The compaction settings in effect: ``None`` when ``auto_compact`` is off."""
        value = self.auto_compact
        if value is True:
            return AutoCompactOptions()
        if isinstance(value, AutoCompactOptions):
            return value
        return None


class QueryOptions(BaseModel):
    """Per-query options of ``Agent.query`` / ``prompt`` / ``prompt_sync``.

    ``stream`` (default True) asks the model client to stream and yields
    ``stream_event`` events; ``output_format`` is passed to the provider;
    ``thinking_config`` / ``reasoning_effort`` / ``request_timeout_ms`` (milliseconds)
    override the agent's; ``signal`` aborts the query (``error_abort``); ``tracer``
    overrides the agent's tracer for this query. Internal seams
    (docs/contracts.md): ``runtime`` and ``trace_context``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    stream: StrictBool = True
    output_format: Any = None
    thinking_config: Any = None
    reasoning_effort: Literal["low", "high", "max"] | None = None
    request_timeout_ms: PositiveInt | None = None
    signal: AbortSignal | None = None
    tracer: Any = None
    runtime: Any = None
    trace_context: Any = None

    @field_validator("thinking_config", mode="before")
    @classmethod
    def _thinking(cls, v: Any) -> Any:
        return _check_thinking(v)

    @field_validator("output_format", mode="before")
    @classmethod
    def _output_format(cls, v: Any) -> Any:
        return _check_output_format(v)

    @field_validator("tracer")
    @classmethod
    def _tracer(cls, v: Any) -> Any:
        if v is not None and not _has_methods(v, "on_event"):
            raise ValueError("no on_event method")
        return v

    @field_validator("runtime")
    @classmethod
    def _runtime(cls, v: Any) -> Any:
        if v is not None and getattr(v, "after_tool_batch", None) is not None:
            if not callable(v.after_tool_batch):
                raise ValueError("after_tool_batch is not callable")
        return v

    @field_validator("trace_context")
    @classmethod
    def _trace_context(cls, v: Any) -> Any:
        from ..tracing.base import TraceContext

        if v is not None and not isinstance(v, TraceContext):
            raise ValueError("not a TraceContext")
        return v


def _short(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _to_config_error(
    where: str, exc: ValidationError, given: Mapping[str, Any], expected: dict[str, str]
) -> ConfigError:
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = first.get("loc", ())
    option = str(loc[0]) if loc else ""
    if option in given and option in expected:
        detail = str(first.get("msg", "")).removeprefix("Value error, ")
        return ConfigError(
            f'{where}: option "{option}" expects {expected[option]}; got {_short(given[option])}. ({detail})'
        )
    # a cross-field check (model_validator) or a nested location
    msg = str(first.get("msg", "")).removeprefix("Value error, ")
    return ConfigError(f"{where}: {msg}")


def validate_agent_options(
    where: str, options: Mapping[str, Any], *, allow_workspace: bool = True
) -> AgentOptions:
    """Validate ``options`` for the factory called ``where``.

    Raises :class:`ConfigError` for an unknown key (``create_bare_agent`` knows no
    ``workspace``), a wrong type, duplicate tool names, or a tool named
    ``submit_output`` while ``output_schema`` is set.
    """
    known = AgentOptions.model_fields.keys()
    for key in options:
        if key not in known or (key == "workspace" and not allow_workspace):
            raise ConfigError(f'{where}: unknown option "{key}". {UNKNOWN_OPTION_HINT}')
    try:
        return AgentOptions(**options)
    except ValidationError as exc:
        raise _to_config_error(where, exc, options, _AGENT_EXPECTED) from None
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def validate_query_options(where: str, options: Mapping[str, Any]) -> QueryOptions:
    """Validate per-query options; raises :class:`ConfigError` like :func:`validate_agent_options`."""
    known = QueryOptions.model_fields.keys()
    for key in options:
        if key not in known:
            raise ConfigError(f'{where}: unknown option "{key}". {UNKNOWN_OPTION_HINT}')
    try:
        return QueryOptions(**options)
    except ValidationError as exc:
        raise _to_config_error(where, exc, options, _QUERY_EXPECTED) from None


def thinking_budget(config: dict[str, Any] | None, max_tokens: int | None) -> dict[str, Any] | None:
    """The thinking config a request sends with ``max_tokens`` (``None``: the
    default, :data:`DEFAULT_MAX_TOKENS`): an ``enabled`` budget capped at
    ``max_tokens - 1``; other configs as they are. Raises :class:`ConfigError`
    when the capped budget is below 1,024 tokens (the provider's minimum)."""
    if config is None or config.get("type") != "enabled":
        return config
    capped = capped_thinking_budget(config["budget_tokens"], max_tokens or DEFAULT_MAX_TOKENS)
    return config if capped == config["budget_tokens"] else {**config, "budget_tokens": capped}


def check_tool_set(tools: list[ToolDefinition], *, output_schema: Any, where: str | None) -> None:
    """Raise :class:`ConfigError` on duplicate tool names, on a tool named
    ``submit_output`` while ``output_schema`` is set, or on a tool named
    ``tool_search`` while any tool is deferred (the names are reserved then)."""
    prefix = f"{where}: " if where else ""
    if any(t.defer for t in tools) and any(t.name == TOOL_SEARCH_NAME for t in tools):
        raise ConfigError(
            f'{prefix}the tool name "{TOOL_SEARCH_NAME}" is reserved while a tool is deferred '
            f"(defer=True): the agent adds its own {TOOL_SEARCH_NAME} tool to load them"
        )
    seen: set[str] = set()
    for t in tools:
        if t.name in seen:
            raise ConfigError(f'{prefix}duplicate tool name "{t.name}"; tool names must be unique per agent')
        seen.add(t.name)
        if output_schema is not None and t.name == SUBMIT_OUTPUT_TOOL_NAME:
            raise ConfigError(
                f'{prefix}the tool name "{SUBMIT_OUTPUT_TOOL_NAME}" is reserved while output_schema is set'
            )


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MAX_TURNS",
    "AgentOptions",
    "AutoCompactOptions",
    "QueryOptions",
    "ToolConcurrencyOptions",
    "WorkspaceOptions",
    "check_tool_set",
    "thinking_budget",
    "validate_agent_options",
    "validate_query_options",
]
