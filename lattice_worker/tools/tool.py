"""Tool definitions: ``tool()``, the ``@tool`` decorator, ``ToolResult`` and ``ToolContext``.

Options and setup errors: docs/tool-effects.md ("Other tool options", "How
concurrency fits together", "Setup errors").

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

This module builds tools (``tool()`` / ``@tool``) and re-exports the rest:
``ToolDefinition`` and input validation live in :mod:`.tool_definition`,
``ToolResult``, ``ToolContext`` and the normalisation of a handler's return
value in :mod:`.tool_result`.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any

from pydantic import ConfigDict, create_model

from ..errors import ConfigError
from .tool_definition import (
    TOOL_NAME_PATTERN,
    ToolDefinition,
    ToolInputError,
    ToolKind,
    format_validation_error,
)
from .tool_result import ToolContext, ToolResult, content_text, normalize_tool_output

_UNKNOWN_OPTION_HINT = (
    "Check for a typo, or upgrade agent-lattice if this option was added in a newer version."
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
    """Create a tool (docs/tool-effects.md). Three forms:

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
