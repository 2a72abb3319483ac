"""Structured output: the ``submit_output`` tool injected by ``output_schema``.

``output_schema`` is either a pydantic ``BaseModel`` subclass or any object
with ``parse(value) -> T`` (an ``OutputSchema``; ``parse`` may be
``async``). For a parse-object the
JSON Schema shown to the model comes from its ``model_json_schema()`` or
``json_schema()`` method, or a ``json_schema`` / ``schema`` dict attribute; without
one the model is told only "an object".

A valid submission's payload -- what lands on ``ResultMessage.structured_result``
-- is JSON-ready: a pydantic instance is dumped with ``model_dump(mode="json")``;
a parse-object's return value is used as is (dumped the same way when it is a
pydantic instance).
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from ..errors import ConfigError, ToolExecutionError
from ..tools.tool import ToolDefinition, ToolResult, format_validation_error

SUBMIT_OUTPUT_TOOL_NAME = "submit_output"
"""Name of the built-in tool injected when ``output_schema`` is set (reserved then)."""

SUBMIT_OUTPUT_DESCRIPTION = (
    "Submit the final structured output and end the task. Call this once, as the only tool call "
    "in its response, when the work is complete; the input must match the schema. If it is "
    "rejected, fix the reported problems and call it again."
)

SUBMITTED_TEXT = "Structured output submitted."


def is_output_schema(value: Any) -> bool:
    """True for a pydantic model class or an object with a callable ``parse``."""
    if isinstance(value, type) and issubclass(value, BaseModel):
        return True
    return callable(getattr(value, "parse", None))


def output_json_schema(schema: Any) -> dict[str, Any]:
    """The JSON Schema for ``submit_output``'s input (always an object schema)."""
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema.model_json_schema()
    for attr in ("model_json_schema", "json_schema"):
        fn = getattr(schema, attr, None)
        if callable(fn):
            out = fn()
            if isinstance(out, dict):
                return out
    for attr in ("json_schema", "schema"):
        out = getattr(schema, attr, None)
        if isinstance(out, dict):
            return out
    return {"type": "object"}


def _to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def _invalid(exc: Exception) -> ToolExecutionError:
    if isinstance(exc, ValidationError):
        return ToolExecutionError(f"invalid output: {format_validation_error(exc)}")
    return ToolExecutionError(f"invalid output: {type(exc).__name__}: {exc}")


def parse_output(schema: Any, raw: Any) -> Any:
    """Validate a submission; returns the JSON-ready payload.

    Raises :class:`ToolExecutionError` with a readable message when it is invalid.
    A parse-object whose ``parse`` is ``async`` gives back its awaitable as is;
    :func:`parse_output_async` awaits it.
    """
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            return schema.model_validate(raw).model_dump(mode="json")
        except ValidationError as exc:
            raise _invalid(exc) from None
    try:
        return _to_jsonable(schema.parse(raw))
    except Exception as exc:
        raise _invalid(exc) from None


async def parse_output_async(schema: Any, raw: Any) -> Any:
    """:func:`parse_output`, awaiting an ``async`` ``parse``; same errors."""
    payload = parse_output(schema, raw)
    if inspect.isawaitable(payload):
        try:
            payload = _to_jsonable(await payload)
        except Exception as exc:
            raise _invalid(exc) from None
    return payload


def build_submit_output_tool(schema: Any) -> ToolDefinition:
    """The ``submit_output`` tool for ``schema``. Its handler validates the
    submission and ends the run (``end_turn``) with the payload as ``structured_result``.

    Raises :class:`ConfigError` when ``schema`` is not an output schema or its JSON
    Schema does not describe an object.
    """
    if not is_output_schema(schema):
        raise ConfigError(
            "output_schema must be a pydantic BaseModel subclass or an object with a parse(value) method"
        )
    json_schema = output_json_schema(schema)
    if json_schema.get("type") != "object":
        raise ConfigError('output_schema: its JSON Schema must describe an object (type "object")')

    async def handler(raw: dict[str, Any]) -> ToolResult:
        payload = await parse_output_async(schema, raw)
        return ToolResult(content=SUBMITTED_TEXT, end_turn=True, structured_result=payload)

    # Validation happens in the handler (one code path for both schema kinds), so the
    # definition takes the schema as a plain dict without its own validator.
    definition = ToolDefinition(
        name=SUBMIT_OUTPUT_TOOL_NAME,
        description=SUBMIT_OUTPUT_DESCRIPTION,
        input_model={"type": "object"},
        handler=handler,
    )
    definition.input_schema = json_schema
    return definition


def payload_text(payload: Any) -> str:
    """The result text of a structured run: the payload as JSON."""
    try:
        return json.dumps(payload, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(payload)


__all__ = [
    "SUBMIT_OUTPUT_TOOL_NAME",
    "build_submit_output_tool",
    "is_output_schema",
    "output_json_schema",
    "parse_output",
    "parse_output_async",
]
