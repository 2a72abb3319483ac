"""Supervisor delegation: expose an agent-like child as a plain tool.

It covers the basic shape, the tool input, a template (``AgentSpec``) or
session target, structured child output with contract inheritance and
assembly-time checks, structured passthrough without a schema, typed
delegation. ``agent_tool()`` returns a :class:`ToolDefinition` of kind
``"agent_tool"``; when the supervisor model calls it with ``mode: "ask"`` the
child runs once and its final answer becomes the ``tool_result``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from ..errors import ConfigError, ToolExecutionError
from ..tools.tool import TOOL_NAME_PATTERN, ToolContext, ToolDefinition, ToolResult
from .depth import delegated, next_depth
from .events import failure_from_result
from .member import agent_kind

_UNKNOWN_OPTION_HINT = (
    "Check for a typo, or upgrade agent-lattice if this option was added in a newer version."
)
CHILD_OUTPUT_INVALID = "child_output_invalid"


class AgentToolInput(BaseModel):
    """The standard model-facing input of an agent tool."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["ask", "handoff", "observe"] = Field(
        description=(
            '"ask": run the agent now and get its final answer as this tool result (use this). '
            '"handoff": needs a team runtime (mailbox team). "observe": not supported.'
        )
    )
    task: str = Field(min_length=1, description="One clear task for the agent.")
    expected_output: str | None = Field(default=None, description="What the answer should look like.")
    acceptance_criteria: list[str] | None = Field(default=None, description="Checks the answer must pass.")


class TaskFields(Protocol):
    """The task fields shared by :class:`AgentToolInput` and the lead's member tools' input."""

    task: str
    expected_output: str | None
    acceptance_criteria: list[str] | None


def format_task(data: TaskFields) -> str:
    """The prompt (or member message) for a delegated task: the task, then the
    expected output and acceptance criteria when given."""
    parts = [data.task.strip()]
    if data.expected_output:
        parts.append(f"Expected output: {data.expected_output.strip()}")
    if data.acceptance_criteria:
        parts.append("Acceptance criteria:\n" + "\n".join(f"- {c.strip()}" for c in data.acceptance_criteria))
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- schemas


def _strip_titles(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_titles(v) for k, v in value.items() if k not in ("title", "description")}
    if isinstance(value, list):
        return [_strip_titles(v) for v in value]
    return value


def schema_json(schema: Any) -> dict[str, Any] | None:
    """The JSON Schema of an output schema (pydantic model class, ``TypeAdapter``,
    or an object with ``model_json_schema()`` / ``json_schema()``), else ``None``."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    if isinstance(schema, TypeAdapter):
        return schema.json_schema()
    for attr in ("model_json_schema", "json_schema"):
        fn = getattr(schema, attr, None)
        if callable(fn):
            try:
                out = fn()
            except Exception:
                return None
            return out if isinstance(out, dict) else None
    return None


def _check_schema_object(where: str, schema: Any) -> None:
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return
    if isinstance(schema, TypeAdapter) or callable(getattr(schema, "parse", None)):
        return
    raise ConfigError(
        f"{where}: output_schema must be a pydantic model class, a TypeAdapter, or an object with parse(); "
        f"got {schema!r}"
    )


def validate_output(schema: Any, value: Any) -> Any:
    """Validate ``value`` against ``schema``; returns the JSON-ready payload.
    Raises ``ValueError`` (or the schema's own error) when it does not validate."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_validate(value).model_dump(mode="json")
    if isinstance(schema, TypeAdapter):
        return schema.dump_python(schema.validate_python(value), mode="json")
    parsed = schema.parse(value)
    if isinstance(parsed, BaseModel):
        return parsed.model_dump(mode="json")
    return parsed


def _target_schema(target: Any, kind: str) -> Any:
    if kind == "host":
        return None  # host adapters expose no readable declaration
    if kind == "spec":
        return getattr(target.options, "output_schema", None)
    return getattr(target, "output_schema", None)


def _target_kind(where: str, target: Any) -> str:
    kind = agent_kind(target)
    if kind is not None:
        return kind
    raise ConfigError(
        f"{where}: target must be an Agent, an AgentSpec, a Team or an object with prompt()/query(); "
        f"got {type(target).__name__}"
    )


# --------------------------------------------------------------------------- running


async def _run_child(child: Any, kind: str, prompt: Any, ctx: ToolContext) -> Any:
    if kind in ("agent", "team", "spec"):
        options: dict[str, Any] = {}
        if ctx.signal is not None:
            options["signal"] = ctx.signal
        return await child.prompt(prompt, **options)
    if callable(getattr(child, "prompt", None)):
        value = child.prompt(prompt)
        return await value if inspect.isawaitable(value) else value
    result = None
    stream = child.query(prompt)
    if inspect.isawaitable(stream):
        stream = await stream
    async for event in stream:
        etype = event.get("type") if isinstance(event, dict) else getattr(event, "type", None)
        if etype == "result":
            result = event
    return result


def _field(result: Any, name: str) -> Any:
    if isinstance(result, dict):
        return result.get(name)
    return getattr(result, name, None)


def _text(result: Any) -> str:
    if isinstance(result, str):
        return result
    value = _field(result, "result")
    return value if isinstance(value, str) else ("" if value is None else str(value))


def child_output_invalid(code: str, message: str) -> ToolResult:
    """The error result for a child whose structured output is missing or
    invalid: ``is_error`` with content ``"child_output_invalid: <code>: <message>"``
    exactly (no ``"Error: "`` prefix)."""
    return ToolResult(content=f"{CHILD_OUTPUT_INVALID}: {code}: {message}", is_error=True)


def _finish(result: Any, schema: Any) -> str | ToolResult:
    """The tool result for a child result (see :func:`agent_tool`)."""
    if result is None:
        if schema is not None:
            return child_output_invalid("no_result", "the child agent produced no result")
        raise ToolExecutionError("the child agent produced no result")
    is_error = not isinstance(result, str) and bool(_field(result, "is_error"))
    if is_error:
        failure = failure_from_result(result)
        if schema is not None:
            return child_output_invalid(failure["code"], failure["message"])
        raise ToolExecutionError(f"the child agent failed ({failure['code']}): {failure['message']}")
    structured = None if isinstance(result, str) else _field(result, "structured_result")
    if schema is not None:
        if structured is None:
            return child_output_invalid(
                "missing_output", "the child ended without submitting structured output"
            )
        try:
            payload = validate_output(schema, structured)
        except ValidationError as exc:
            return child_output_invalid("schema_mismatch", str(exc))
        except Exception as exc:
            return child_output_invalid("schema_mismatch", f"{type(exc).__name__}: {exc}")
        return json.dumps(payload, ensure_ascii=False)
    if structured is not None:
        return json.dumps(structured, ensure_ascii=False, default=str)
    return _text(result)


# --------------------------------------------------------------------------- factory


def _description(name: str, target: Any, kind: str, given: str | None, schema: Any, typed: bool) -> str:
    if given is not None:
        text = given.strip()
    else:
        label = getattr(target, "name", None) or name
        text = f'Ask the "{label}" agent to do one task and return its final answer.'
    if kind == "spec":
        text += (
            " Each call starts a fresh agent session with no memory of earlier calls, so make every task "
            "self-contained."
        )
    else:
        text += " This agent keeps its conversation across calls: earlier tasks can inform later answers."
    if schema is not None:
        shape = schema_json(schema)
        text += " The result is the agent's structured output as JSON"
        text += f" matching this JSON Schema: {json.dumps(shape, separators=(',', ':'))}." if shape else "."
    if not typed:
        text += ' Use mode "ask".'
    return text


def agent_tool(
    name: str,
    target: Any,
    *,
    description: str | None = None,
    output_schema: Any = None,
    input_schema: type[BaseModel] | Mapping[str, Any] | None = None,
    map_input: Callable[[Any], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    **unknown: Any,
) -> ToolDefinition:
    """Wrap an agent-like ``target`` as a tool.

    Args:
        name: the tool name (``^[a-zA-Z0-9_-]{1,64}$``).
        target: an ``AgentSpec`` (a fresh session per call; calls may run
            concurrently), a live ``Agent`` or ``Team`` (one session that keeps its
            history), or a host AgentLike with ``prompt()`` / ``query()``.
        description: what the supervisor model is told; the generated text adds
            whether the target keeps history, and the output contract.
        output_schema: the child's output contract. Inherited from the target
            (``spec.options.output_schema`` / ``agent.output_schema``) when omitted;
            an explicit one must be the same object or have the same JSON Schema.
        input_schema / map_input: typed delegation, given together: the tool input
            is ``input_schema`` (a pydantic model class or a JSON Schema dict) and
            ``map_input(parsed)`` (sync or async) returns the child prompt (a str or
            a list of content blocks). Ask-only; invalid input is rejected before
            the child runs.
        metadata: host annotations on the ``ToolDefinition`` (never shown to the model).

    Standard input ``{mode, task, expected_output?, acceptance_criteria?}``:
    ``ask`` runs the child and returns its final text -- or, with an output
    schema, the validated structured output as JSON (a failed or missing
    submission is an error result starting ``child_output_invalid:``; with
    no schema on either side a child ``structured_result`` is passed through as
    JSON); ``handoff`` returns an error result (it needs a mailbox team
    runtime); ``observe`` returns an "unsupported" error result. The
    ``child_output_invalid:`` results are exactly ``"child_output_invalid:
    <code>: <message>"`` (code ``missing_output``, ``schema_mismatch``,
    ``no_result`` or the child's failure code such as ``error_max_turns``);
    other error results read ``"Error: <message>"`` (the agent loop's format
    for raised tool errors).

    The child runs one delegation level below the caller; a call beyond the
    limit (``RunnerOptions.max_delegate_depth``, see
    :mod:`lattice_worker.team.depth`) is an error result and the child never runs.

    Raises :class:`ConfigError` (prefixed ``agent_tool("<name>"):``) for an
    unknown option, an invalid name or target, a mismatching explicit
    ``output_schema``, or ``input_schema`` / ``map_input`` given alone.
    """
    return _build(
        f'agent_tool("{name}")',
        name,
        target,
        description=description,
        output_schema=output_schema,
        input_schema=input_schema,
        map_input=map_input,
        metadata=metadata,
        unknown=unknown,
    )


def delegate_tool(
    name: str,
    description: str,
    agent: Any,
    *,
    output_schema: Any = None,
    input_schema: type[BaseModel] | Mapping[str, Any] | None = None,
    map_input: Callable[[Any], Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    **unknown: Any,
) -> ToolDefinition:
    """Expose ``agent`` as a delegate tool: :func:`agent_tool` with the
    description given up front (the supervisor model decides from it when to
    delegate).

    Args:
        name: the tool name (``^[a-zA-Z0-9_-]{1,64}$``).
        description: what the supervisor model is told (a non-empty string).
        agent: an ``AgentSpec`` (a fresh session per call), a live ``Agent`` or
            ``Team``, or a host AgentLike -- as for :func:`agent_tool`.
        output_schema / input_schema / map_input / metadata: as for :func:`agent_tool`.

    The tool behaves exactly like :func:`agent_tool`'s (the same input, modes,
    results and delegation-depth limit). Work that must go through a team's
    mailbox -- ``handoff``, durable status, replies -- is a team member's
    (:func:`~lattice_worker.team.team.create_team` gives the lead one tool per
    member).

    Raises :class:`ConfigError` (prefixed ``delegate_tool("<name>"):``) as
    :func:`agent_tool` does, and for a missing or blank ``description``.
    """
    where = f'delegate_tool("{name}")'
    if not isinstance(description, str) or not description.strip():
        raise ConfigError(f"{where}: description must be a non-empty string")
    return _build(
        where,
        name,
        agent,
        description=description,
        output_schema=output_schema,
        input_schema=input_schema,
        map_input=map_input,
        metadata=metadata,
        unknown=unknown,
    )


def _build(
    where: str,
    name: str,
    target: Any,
    *,
    description: str | None,
    output_schema: Any,
    input_schema: type[BaseModel] | Mapping[str, Any] | None,
    map_input: Callable[[Any], Any] | None,
    metadata: Mapping[str, Any] | None,
    unknown: Mapping[str, Any],
) -> ToolDefinition:
    for key in unknown:
        raise ConfigError(f'{where}: unknown option "{key}". {_UNKNOWN_OPTION_HINT}')
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise ConfigError(f"{where}: invalid name; a tool name must match ^[a-zA-Z0-9_-]{{1,64}}$")
    kind = _target_kind(where, target)
    if description is not None and (not isinstance(description, str) or not description.strip()):
        raise ConfigError(f"{where}: description must be a non-empty string")
    if metadata is not None and not isinstance(metadata, Mapping):
        raise ConfigError(f"{where}: metadata must be a dict, got {type(metadata).__name__}")
    if (input_schema is None) != (map_input is None):
        given, missing = ("input_schema", "map_input") if map_input is None else ("map_input", "input_schema")
        raise ConfigError(
            f"{where}: {given} needs {missing}; typed delegation takes input_schema and map_input together"
        )
    if map_input is not None and not callable(map_input):
        raise ConfigError(f"{where}: map_input must be callable")
    if input_schema is not None and not (
        isinstance(input_schema, Mapping)
        or (isinstance(input_schema, type) and issubclass(input_schema, BaseModel))
    ):
        raise ConfigError(f"{where}: input_schema must be a pydantic model class or a JSON Schema dict")

    declared = _target_schema(target, kind)
    if output_schema is not None:
        _check_schema_object(where, output_schema)
        if declared is not None and output_schema is not declared:
            mine, theirs = schema_json(output_schema), schema_json(declared)
            if mine is None or theirs is None or _strip_titles(mine) != _strip_titles(theirs):
                raise ConfigError(
                    f"{where}: output_schema does not match the target's declared output_schema. Share one "
                    "schema object between the agent (create_agent/define_agent) and agent_tool(), or omit "
                    "output_schema here to inherit the target's."
                )
    schema = output_schema if output_schema is not None else declared
    typed = input_schema is not None

    async def run(prompt: Any, ctx: ToolContext) -> str | ToolResult:
        depth = next_depth(where)
        child = target.spawn() if kind == "spec" else target
        with delegated(depth):
            result = await _run_child(child, kind, prompt, ctx)
        return _finish(result, schema)

    if typed:
        assert map_input is not None

        async def typed_handler(data: Any, ctx: ToolContext) -> str | ToolResult:
            prompt = map_input(data)
            if inspect.isawaitable(prompt):
                prompt = await prompt
            if isinstance(prompt, str):
                if not prompt.strip():
                    raise ToolExecutionError(f"{where}: map_input returned an empty prompt")
            elif not (
                isinstance(prompt, list)
                and prompt
                and all(isinstance(b, dict) and "type" in b for b in prompt)
            ):
                raise ToolExecutionError(
                    f"{where}: map_input must return a str or a non-empty list of content blocks, "
                    f"got {type(prompt).__name__}"
                )
            return await run(prompt, ctx)

        handler: Callable[..., Any] = typed_handler
        input_model: Any = input_schema
    else:

        async def standard_handler(data: AgentToolInput, ctx: ToolContext) -> str | ToolResult:
            if data.mode == "handoff":
                raise ToolExecutionError(
                    f'{where}: mode "handoff" needs a team runtime, and agent_tool runs its child directly. '
                    'Use mode "ask", or make the agent a member of a mailbox team (create_team) for handoffs.'
                )
            if data.mode == "observe":
                raise ToolExecutionError(f'{where}: mode "observe" is unsupported here; use mode "ask"')
            return await run(format_task(data), ctx)

        handler = standard_handler
        input_model = AgentToolInput

    return ToolDefinition(
        name=name,
        description=_description(name, target, kind, description, schema, typed),
        input_model=input_model,
        handler=handler,
        kind="agent_tool",
        is_concurrency_safe=kind == "spec",
        metadata=metadata,
    )


__all__ = [
    "AgentToolInput",
    "CHILD_OUTPUT_INVALID",
    "agent_tool",
    "child_output_invalid",
    "delegate_tool",
    "schema_json",
    "validate_output",
]
