"""``ToolDefinition``: a tool as an Agent holds it, and the validation of the
model's input for it (a pydantic model or a JSON Schema dict).

Build one with :func:`lattice_worker.tools.tool.tool` (or ``@tool``); the
team runtime builds ``agent_tool`` kinds directly. Effect options are checked
by :mod:`lattice_worker.tools.effects`.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import re
import types
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from contextvars import ContextVar
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, ToolExecutionError
from .effects import Effect, Reconcile, check_effect_options
from .tool_result import ToolContext, ToolResult, normalize_tool_output

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names the Anthropic Messages API accepts."""

ToolKind = Literal["tool", "agent_tool"]

sync_handlers_in_threads: ContextVar[bool] = ContextVar("lattice_sync_handlers_in_threads", default=False)
"""When true, a tool whose handler is a plain (not ``async``) function runs it in
a thread (``asyncio.to_thread``) instead of on the event loop. The distributed
runtime sets it for every step: a worker runs many steps on one event loop
(docs/deploy.md, "Pools and sizing"), which a blocking handler would stall.
In-process agents and teams leave it false: handlers run on the loop."""


sync_handler_executor: ContextVar[Executor | None] = ContextVar("lattice_sync_handler_executor", default=None)
"""The thread pool the handlers :data:`sync_handlers_in_threads` sends to a
thread run in; ``None``: the event loop's default executor (``asyncio.to_thread``).
The asyncio worker pool gives them one of their own, so blocking tools never
take the threads its loop needs for DNS lookups and the SQL mailboxes."""


async def in_handler_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``await``: the blocking ``fn(*args)`` run in a thread in the caller's context
    (as ``asyncio.to_thread``), on :data:`sync_handler_executor` when one is set,
    else the loop's default executor. For tools' blocking work."""
    call = functools.partial(fn, *args)
    executor = sync_handler_executor.get()
    if executor is None:
        return await asyncio.to_thread(call)
    return await asyncio.get_running_loop().run_in_executor(executor, contextvars.copy_context().run, call)


class ToolInputError(ToolExecutionError):
    """The model's input for a tool did not match its input schema."""


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(input)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _positional_arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` accepts (``None`` = any number)."""
    if (
        isinstance(fn, types.FunctionType)
        and not hasattr(fn, "__wrapped__")
        and not hasattr(fn, "__signature__")
    ):
        return _code_arity(fn.__code__)  # (the built-in tools' handlers: made per agent, one code object)
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    count = 0
    for p in sig.parameters.values():
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            return None
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


@functools.lru_cache(maxsize=1024)
def _code_arity(code: types.CodeType) -> int | None:
    """:func:`_positional_arity` of a plain function with this code object."""
    if code.co_flags & inspect.CO_VARARGS:
        return None
    return code.co_argcount


class ToolDefinition:
    """A tool as an Agent holds it.

    Attributes:
        name: the name the model calls (``^[a-zA-Z0-9_-]{1,64}$``).
        description: what the model is told about the tool.
        input_schema: JSON Schema (dict) of the input, sent to the model.
        input_model: the pydantic model validating input, or ``None`` when the tool
            was built from a raw JSON Schema dict (validated with ``jsonschema``).
        metadata: host-owned annotations, or ``None`` when not given; never sent to
            the model.
        kind: ``"tool"`` or ``"agent_tool"`` (what ``tool_batch_policy`` sees).
        is_concurrency_safe: ``None``, a bool, or ``callable(parsed_input) -> bool``.
        effect: ``"read_only"`` | ``"idempotent"`` | ``"reconcilable"`` | ``"unguarded"``
            (see :mod:`lattice_worker.tools.effects`).
        dedup_window_s: seconds the provider drops a repeated effect key (idempotent
            tools only; ``math.inf`` for a call idempotent over its input), else ``None``.
        reconcile: the :class:`~lattice_worker.tools.effects.Reconcile` of a
            reconcilable tool, else ``None``.
        ends_turn: a successful call ends the turn without another model call.
        concurrent: calls of one model response may overlap (read_only tools only).
        defer: the model sees only the tool's name until ``tool_search`` loads it.

    Build one with :func:`tool`; the team runtime builds ``agent_tool`` kinds directly.
    Raises :class:`ConfigError` on an invalid name, description, schema or handler.
    """

    __slots__ = (
        "name",
        "description",
        "input_schema",
        "input_model",
        "metadata",
        "kind",
        "is_concurrency_safe",
        "effect",
        "dedup_window_s",
        "reconcile",
        "ends_turn",
        "concurrent",
        "defer",
        "_handler",
        "_handler_is_async",
        "_pass_context",
        "_unpack_fields",
        "_context_param",
        "_schema_validator",
    )

    def __init__(
        self,
        *,
        name: str,
        description: str,
        input_model: type[BaseModel] | Mapping[str, Any],
        handler: Callable[..., Any],
        is_concurrency_safe: bool | Callable[[Any], Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        kind: ToolKind = "tool",
        unpack_fields: bool = False,
        context_param: str | None = None,
        effect: Effect = "unguarded",
        dedup_window_s: float | None = None,
        reconcile: Reconcile | None = None,
        ends_turn: bool = False,
        concurrent: bool = False,
        defer: bool = False,
        runs: str = "host",
    ) -> None:
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
            raise ConfigError(
                f"tool: invalid name {name!r}; a tool name must match ^[a-zA-Z0-9_-]{{1,64}}$ "
                "(letters, digits, '_' or '-', at most 64 characters)"
            )
        where = f'tool("{name}")'
        if not isinstance(description, str) or not description.strip():
            raise ConfigError(f"{where}: description must be a non-empty string, got {description!r}")
        if not callable(handler):
            raise ConfigError(f"{where}: handler must be callable, got {type(handler).__name__}")
        if is_concurrency_safe is not None and not isinstance(is_concurrency_safe, bool):
            if not callable(is_concurrency_safe):
                raise ConfigError(
                    f"{where}: is_concurrency_safe must be a bool or a callable(input) -> bool, "
                    f"got {type(is_concurrency_safe).__name__}"
                )
        if metadata is not None and not isinstance(metadata, Mapping):
            raise ConfigError(f"{where}: metadata must be a dict, got {type(metadata).__name__}")
        if kind not in ("tool", "agent_tool"):
            raise ConfigError(f"{where}: kind must be 'tool' or 'agent_tool', got {kind!r}")
        effects = check_effect_options(
            where,
            effect=effect,
            dedup_window_s=dedup_window_s,
            reconcile=reconcile,
            ends_turn=ends_turn,
            concurrent=concurrent,
            defer=defer,
            runs=runs,
            is_concurrency_safe=is_concurrency_safe,
        )

        self._schema_validator: Any = None
        if (
            isinstance(input_model, type)
            and issubclass(input_model, BaseModel)
            and input_model is not BaseModel
        ):
            self.input_model: type[BaseModel] | None = input_model
            schema = json.loads(_model_schema(input_model))
        elif isinstance(input_model, Mapping):
            self.input_model = None
            schema = dict(input_model)
            self._schema_validator = _build_jsonschema_validator(schema, where)
        else:
            raise ConfigError(
                f"{where}: the input model must be a pydantic BaseModel subclass or a JSON Schema dict, "
                f"got {input_model!r}"
            )
        if schema.get("type") != "object":
            raise ConfigError(f'{where}: the input schema must describe an object (type "object")')

        self.name = name
        self.description = description
        self.input_schema: dict[str, Any] = schema
        self.metadata: dict[str, Any] | None = dict(metadata) if metadata is not None else None
        self.kind: ToolKind = kind
        self.is_concurrency_safe = is_concurrency_safe
        self.effect: Effect = effects.effect
        self.dedup_window_s = effects.dedup_window_s
        self.reconcile = effects.reconcile
        self.ends_turn = effects.ends_turn
        self.concurrent = effects.concurrent
        self.defer = effects.defer
        self._handler = handler
        # an async def function (or partial of one), or an object whose __call__ is one
        self._handler_is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            type(handler).__call__
        )
        self._unpack_fields = unpack_fields
        self._context_param = context_param
        if unpack_fields:
            self._pass_context = context_param is not None
        else:
            arity = _positional_arity(handler)
            self._pass_context = arity is None or arity >= 2

    def __repr__(self) -> str:
        return f"ToolDefinition(name={self.name!r}, kind={self.kind!r}, effect={self.effect!r})"

    def to_model_tool(self) -> dict[str, Any]:
        """The tool as the model sees it: ``{"name", "description", "input_schema"}``."""
        return {"name": self.name, "description": self.description, "input_schema": self.input_schema}

    def parse_input(self, raw: Any) -> Any:
        """Validate the model's raw input.

        ``None`` or ``""`` means ``{}``. Returns the pydantic model instance (or the
        dict, for a JSON Schema tool). Raises :class:`ToolInputError` with a
        readable message when the input is not an object or does not validate.
        """
        if raw is None or raw == "":
            raw = {}
        if not isinstance(raw, dict):
            raise ToolInputError(
                f'input for tool "{self.name}" must be a JSON object, got {_json_type_name(raw)}'
            )
        if self.input_model is not None:
            try:
                return self.input_model.model_validate(raw)
            except ValidationError as exc:
                raise ToolInputError(
                    f'invalid input for tool "{self.name}": {format_validation_error(exc)}'
                ) from None
        if self._schema_validator is not None:
            errors = sorted(self._schema_validator.iter_errors(raw), key=lambda e: list(e.path))
            if errors:
                detail = "; ".join(
                    f"{'.'.join(str(p) for p in e.path) or '(input)'}: {e.message}" for e in errors
                )
                raise ToolInputError(f'invalid input for tool "{self.name}": {detail}')
        return raw

    def check_concurrency_safe(self, parsed: Any) -> bool:
        """``True`` for a ``concurrent`` tool, else ``is_concurrency_safe(parsed)``;
        missing, false, raising, or anything but ``True`` -> ``False``. The check is synchronous: an ``async def`` check's
        coroutine is closed unawaited and counts as ``False``."""
        if self.concurrent:
            return True
        check = self.is_concurrency_safe
        if check is None or check is False:
            return False
        if check is True:
            return True
        try:
            answer = check(parsed)
        except Exception:
            return False
        if inspect.iscoroutine(answer):
            answer.close()  # no "never awaited" warning
            return False
        return answer is True

    async def invoke(self, parsed: Any, ctx: ToolContext) -> ToolResult:
        """Run the handler on already-parsed input and normalise its return value
        (a plain-function handler in a thread when :data:`sync_handlers_in_threads` is set).

        Raises whatever the handler raises, or :class:`ToolExecutionError` when the
        handler returns something that is not a valid tool result.
        """
        handler = self._handler
        if self._unpack_fields:
            kwargs = {k: getattr(parsed, k) for k in type(parsed).model_fields}
            if self._context_param is not None:
                kwargs[self._context_param] = ctx
            call = functools.partial(handler, **kwargs)
        elif self._pass_context:
            call = functools.partial(handler, parsed, ctx)
        else:
            call = functools.partial(handler, parsed)
        if not self._handler_is_async and sync_handlers_in_threads.get():
            value = await in_handler_thread(call)
        else:
            value = call()
        if inspect.isawaitable(value):
            value = await value
        return normalize_tool_output(self.name, value)


@functools.lru_cache(maxsize=512)
def _model_schema(input_model: type[BaseModel]) -> str:
    # A model's JSON schema (as JSON text), generated once per process: the
    # built-in tools are made again for every agent over a workspace (every
    # step), with the same models, and pydantic's generation took most of a
    # step's CPU. Each tool gets its own copy (json.loads).
    return json.dumps(input_model.model_json_schema())


def _build_jsonschema_validator(schema: dict[str, Any], where: str) -> Any:
    try:
        import jsonschema
    except ImportError:  # pragma: no cover - jsonschema ships with mcp
        return None
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ConfigError(f"{where}: invalid JSON Schema: {exc.message}") from None
    return cls(schema)


__all__ = [
    "TOOL_NAME_PATTERN",
    "ToolDefinition",
    "ToolInputError",
    "ToolKind",
    "format_validation_error",
    "in_handler_thread",
    "sync_handler_executor",
    "sync_handlers_in_threads",
]
