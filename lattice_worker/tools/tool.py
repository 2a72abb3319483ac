"""Tool definitions: ``tool()``, the ``@tool`` decorator, ``ToolResult`` and ``ToolContext``.

Spec: AgentLattice "Tools" (tool result, end the run from a tool, run
independent tools concurrently, tool metadata, strict option validation).

A tool is a host function the model may call. Its input is described by a
pydantic model (or, for adapters such as MCP, a raw JSON Schema dict) and
validated *before* the handler runs; the agent loop turns every failure into an
error ``tool_result`` so one broken call never ends the run.

Handlers may be sync or async. Sync handlers run on the event-loop thread, so
keep them short (wrap blocking work in ``asyncio.to_thread``). A handler takes
the parsed input and, optionally, a second argument: the :class:`ToolContext`.
It returns one of:

* a ``str`` -- the tool_result text;
* a ``list`` of Anthropic content blocks (dicts with a ``type``);
* a :class:`ToolResult`;
* a ``dict`` with the keys of :class:`ToolResult` (``content`` required).
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from ..errors import ConfigError, ToolExecutionError
from .effects import Effect, Reconcile, check_effect_options

if TYPE_CHECKING:
    from ..agent.abort import AbortSignal

TOOL_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names the Anthropic Messages API accepts."""

ToolKind = Literal["tool", "agent_tool"]

_UNKNOWN_OPTION_HINT = (
    "Check for a typo, or upgrade agent-lattice if this option was added in a newer version."
)


class ToolInputError(ToolExecutionError):
    """The model's input for a tool did not match its input schema."""


@dataclass
class ToolResult:
    """What a handler may return (spec "Tool result").

    Attributes:
        content: the tool_result content: text, or a list of content blocks (dicts).
        end_turn: end the run after this batch with subtype ``"success"`` instead of
            calling the model again; the first ``end_turn`` result of a batch (in
            tool_use order) gives the result text.
        structured_result: carried to ``ResultMessage.structured_result`` only when
            ``end_turn`` is true; ignored otherwise.
        is_error: the call failed: the ``tool_result`` block carries
            ``is_error: true`` and ``content`` exactly as given (no ``"Error: "``
            prefix is added, unlike a raised exception), so a tool can pin the
            error text the model sees (e.g. ``child_output_invalid: ...``). An
            error result never ends the turn: ``end_turn`` and
            ``structured_result`` are ignored.
    """

    content: str | list[dict[str, Any]]
    end_turn: bool = False
    structured_result: Any = None
    is_error: bool = False


@dataclass
class ToolContext:
    """The optional second argument of a handler.

    Attributes:
        tool_use_id: id of the ``tool_use`` block being answered.
        tool_name: the tool's registered name.
        signal: the query's :class:`~lattice_worker.agent.abort.AbortSignal`; it is
            aborted when the query's ``signal`` is (spec "Deadlines").
        runtime: the query's ``runtime`` option (team / distributed runtimes), or ``None``.
        agent: the :class:`~lattice_worker.agent.agent.Agent` running the call.
        effect_key: the call's idempotency key (a str): the same for every attempt
            of this one call -- after a crash, a re-claim or a recovery on another
            worker -- and different for every other call. Send it to your provider
            as its idempotency key (``effect="idempotent"``) and look it up in
            ``Reconcile.lookup`` (``effect="reconcilable"``). ``None`` only for a
            context built by hand.
    """

    tool_use_id: str
    tool_name: str
    signal: AbortSignal | None = None
    runtime: Any = None
    agent: Any = None
    effect_key: str | None = None


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


def content_text(content: Any) -> str:
    """The text of a message or tool_result ``content``: the str itself, or the
    ``text`` of its text blocks joined; ``""`` for anything else."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
    return ""


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem: ``field.path: message``."""
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err.get("loc", ())) or "(input)"
        parts.append(f"{loc}: {err.get('msg', 'invalid')}")
    return "; ".join(parts)


def _positional_arity(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` accepts (``None`` = any number)."""
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


class ToolDefinition:
    """A tool as an Agent holds it.

    Attributes:
        name: the name the model calls (``^[a-zA-Z0-9_-]{1,64}$``).
        description: what the model is told about the tool.
        input_schema: JSON Schema (dict) of the input, sent to the model.
        input_model: the pydantic model validating input, or ``None`` when the tool
            was built from a raw JSON Schema dict (validated with ``jsonschema``).
        metadata: host-owned annotations, or ``None`` when not given; never sent to
            the model (spec "Tool metadata").
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
            schema = input_model.model_json_schema()
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
        """Run the handler on already-parsed input and normalise its return value.

        Raises whatever the handler raises, or :class:`ToolExecutionError` when the
        handler returns something that is not a valid tool result.
        """
        handler = self._handler
        if self._unpack_fields:
            kwargs = {k: getattr(parsed, k) for k in type(parsed).model_fields}
            if self._context_param is not None:
                kwargs[self._context_param] = ctx
            value = handler(**kwargs)
        elif self._pass_context:
            value = handler(parsed, ctx)
        else:
            value = handler(parsed)
        if inspect.isawaitable(value):
            value = await value
        return normalize_tool_output(self.name, value)


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


def _check_blocks(name: str, blocks: list[Any]) -> list[dict[str, Any]]:
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ToolExecutionError(
                f'tool "{name}" returned a content list whose item {i} is not a content block '
                f'(a dict with a "type")'
            )
    return blocks


def normalize_tool_output(name: str, value: Any) -> ToolResult:
    """Turn a handler's return value into a :class:`ToolResult` (see module doc).

    Raises :class:`ToolExecutionError` for anything else (``None`` included), and
    for an ``end_turn`` or ``is_error`` that is not a bool.
    """
    if isinstance(value, ToolResult):
        content = value.content
        if isinstance(content, list):
            _check_blocks(name, content)
        elif not isinstance(content, str):
            raise ToolExecutionError(
                f'tool "{name}" returned ToolResult.content of type {type(content).__name__}; '
                "expected a str or a list of content blocks"
            )
        for flag in ("end_turn", "is_error"):
            # "false" or 0 must not end a run (or fail a call) by being truthy
            if not isinstance(getattr(value, flag), bool):
                raise ToolExecutionError(
                    f'tool "{name}" returned {flag}={getattr(value, flag)!r}; {flag} must be True or False'
                )
        return value
    if isinstance(value, str):
        return ToolResult(content=value)
    if isinstance(value, list):
        return ToolResult(content=_check_blocks(name, value))
    if isinstance(value, dict):
        extra = set(value) - {"content", "end_turn", "structured_result", "is_error"}
        if "content" not in value or extra:
            raise ToolExecutionError(
                f'tool "{name}" returned a dict with keys {sorted(value)}; a result dict needs "content" '
                'and may have "end_turn", "structured_result" and "is_error" only'
            )
        return normalize_tool_output(
            name,
            ToolResult(
                content=value["content"],
                end_turn=value.get("end_turn", False),
                structured_result=value.get("structured_result"),
                is_error=value.get("is_error", False),
            ),
        )
    raise ToolExecutionError(
        f'tool "{name}" returned {type(value).__name__}; return a str, a list of content blocks, '
        "a ToolResult or a dict with a content key"
    )


# --------------------------------------------------------------------------- tool()

_TOOL_OPTIONS = (
    "is_concurrency_safe",
    "metadata",
    "effect",
    "dedup_window_s",
    "reconcile",
    "ends_turn",
    "concurrent",
    "defer",
    "runs",
)


def _check_tool_options(where: str, options: dict[str, Any]) -> None:
    for key in options:
        if key not in _TOOL_OPTIONS:
            raise ConfigError(f'{where}: unknown option "{key}". {_UNKNOWN_OPTION_HINT}')


def _first_paragraph(doc: str | None) -> str | None:
    if not doc:
        return None
    text = inspect.cleandoc(doc)
    para = text.split("\n\n", 1)[0].strip()
    return " ".join(para.split()) or None


def _is_context_annotation(annotation: Any) -> bool:
    """``ToolContext`` itself, or an optional/union type containing it."""
    if annotation is ToolContext:
        return True
    return ToolContext in typing.get_args(annotation)


def _from_function(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    options: dict[str, Any],
) -> ToolDefinition:
    tool_name = name if name is not None else getattr(fn, "__name__", None)
    where = f'tool("{tool_name}")'
    _check_tool_options(where, options)
    desc = description if description is not None else _first_paragraph(fn.__doc__)
    if desc is None:
        raise ConfigError(f"{where}: no description given and the function has no docstring")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot resolve the type hints of {fn!r}: {exc}") from None
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigError(
                f"{where}: *args/**kwargs cannot be described to the model; name every parameter"
            )
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigError(f"{where}: positional-only parameters are not supported")
        annotation = hints.get(param.name, Any)
        if _is_context_annotation(annotation):
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (annotation, default)
    model_name = "".join(part.capitalize() for part in re.split(r"[_-]", str(tool_name))) + "Input"
    try:
        model = create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)
    except Exception as exc:
        raise ConfigError(f"{where}: cannot build an input model from the signature: {exc}") from None
    return ToolDefinition(
        name=tool_name,  # type: ignore[arg-type]
        description=desc,
        input_model=model,
        handler=fn,
        unpack_fields=True,
        context_param=context_param,
        **options,
    )


def tool(*args: Any, **kwargs: Any) -> Any:
    """Create a tool (spec "Tools"). Three forms:

    * ``tool(name, description, InputModel, handler, *, effect="unguarded", dedup_window_s=None,
      reconcile=None, ends_turn=False, concurrent=False, defer=False, runs="host",
      is_concurrency_safe=None, metadata=None)`` -- ``InputModel`` is a pydantic
      ``BaseModel`` subclass (or a JSON Schema dict); ``handler(input)`` or
      ``handler(input, ctx)`` gets the validated model instance.
    * ``@tool`` on a typed function -- the input model is derived from the signature
      (a parameter annotated :class:`ToolContext` receives the context instead), the
      description is the docstring's first paragraph, the name the function's.
    * ``@tool(name=..., description=..., effect=..., ...)`` -- the same with overrides
      and any of the keyword options above.

    Effect options (``docs/tool-effects.md``): ``effect`` says what the tool does to
    the outside world and so what happens after a crash; ``dedup_window_s``
    (**seconds**, idempotent tools only) how long the provider drops a repeated
    ``ToolContext.effect_key``; ``reconcile`` a
    :class:`~lattice_worker.tools.effects.Reconcile` (reconcilable tools only);
    ``ends_turn`` ends the turn when the call succeeds (the run's result is the
    model's last text); ``concurrent`` lets calls of one model response overlap
    (read_only tools only, at most 8 at once); ``defer`` hides the tool behind
    ``tool_search`` until the model loads it.

    Returns a :class:`ToolDefinition` (or, for the configured decorator form, a
    decorator producing one). Raises :class:`ConfigError` on an unknown option key,
    an invalid name (``^[a-zA-Z0-9_-]{1,64}$``), a missing description, an
    input model that is not a pydantic model class / JSON Schema dict, or an
    effect setup error: ``dedup_window_s`` without ``effect="idempotent"`` or the
    reverse; ``reconcile`` without ``effect="reconcilable"`` or the reverse;
    ``concurrent`` on a tool that is not read_only or that ends the turn;
    ``defer`` with ``ends_turn``; ``runs="sandbox"`` (not supported yet).
    """
    # @tool  (bare decorator)
    if len(args) == 1 and callable(args[0]) and not isinstance(args[0], str) and not kwargs:
        return _from_function(args[0], name=None, description=None, options={})

    # @tool(...) / @tool("name", ...) decorator factory
    if (
        len(args) <= 2
        and all(isinstance(a, str) for a in args)
        and "handler" not in kwargs
        and ("input_model" not in kwargs)
    ):
        name = args[0] if args else kwargs.pop("name", None)
        description = args[1] if len(args) > 1 else kwargs.pop("description", None)
        if args and "name" in kwargs:
            raise ConfigError("tool: name given twice")
        where = f'tool("{name}")' if name else "tool"
        _check_tool_options(where, kwargs)
        options = dict(kwargs)

        def decorator(fn: Callable[..., Any]) -> ToolDefinition:
            if not callable(fn):
                raise ConfigError(f"{where}: the decorated object must be a function, got {fn!r}")
            return _from_function(fn, name=name, description=description, options=options)

        return decorator

    # full form
    names = ("name", "description", "input_model", "handler")
    if len(args) > 4:
        raise ConfigError(
            f"tool: expected at most 4 positional arguments (name, description, InputModel, handler), got {len(args)}"
        )
    values = dict(zip(names, args, strict=False))
    for key in names[len(args) :]:
        if key in kwargs:
            values[key] = kwargs.pop(key)
    missing = [k for k in names if k not in values]
    name = values.get("name")
    where = f'tool("{name}")' if isinstance(name, str) else "tool"
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    _check_tool_options(where, kwargs)
    return ToolDefinition(
        name=values["name"],
        description=values["description"],
        input_model=values["input_model"],
        handler=values["handler"],
        **kwargs,
    )


__all__ = [
    "TOOL_NAME_PATTERN",
    "ToolContext",
    "ToolDefinition",
    "ToolInputError",
    "ToolKind",
    "ToolResult",
    "content_text",
    "format_validation_error",
    "normalize_tool_output",
    "tool",
]
