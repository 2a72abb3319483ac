"""tool() / @tool / ToolDefinition / ToolResult (docs/tool-effects.md, "Other
tool options", "Setup errors")."""

from __future__ import annotations

import inspect
from typing import Annotated

import pytest
from pydantic import BaseModel, Field

from lattice_worker import ConfigError, ToolContext, ToolDefinition, ToolResult, tool
from lattice_worker.errors import ToolExecutionError
from lattice_worker.tools.tool import ToolInputError, normalize_tool_output


class CalcInput(BaseModel):
    expr: str
    precision: int = 2


def calc_handler(inp: CalcInput) -> str:
    return f"{inp.expr}@{inp.precision}"


def test_full_form_builds_a_definition_with_the_models_json_schema():
    t = tool("calc", "Evaluate an expression", CalcInput, calc_handler)
    assert isinstance(t, ToolDefinition)
    assert t.name == "calc"
    assert t.description == "Evaluate an expression"
    assert t.kind == "tool"
    assert t.input_schema["type"] == "object"
    assert t.input_schema["required"] == ["expr"]
    assert set(t.input_schema["properties"]) == {"expr", "precision"}
    assert t.metadata is None
    assert t.is_concurrency_safe is None
    assert t.to_model_tool() == {
        "name": "calc",
        "description": "Evaluate an expression",
        "input_schema": t.input_schema,
    }


def test_metadata_passes_through_and_is_never_shown_to_the_model():
    t = tool("calc", "Evaluate", CalcInput, calc_handler, metadata={"contract": 3})
    assert t.metadata == {"contract": 3}
    assert "metadata" not in t.to_model_tool()
    assert "contract" not in repr(t.to_model_tool())


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "dot.name", "ünïcode", None])
def test_invalid_names_are_rejected(name):
    with pytest.raises(ConfigError, match="a-zA-Z0-9_-"):
        tool(name, "d", CalcInput, calc_handler)


def test_unknown_tool_option_raises_naming_the_key():
    with pytest.raises(ConfigError) as err:
        tool("calc", "d", CalcInput, calc_handler, bogus_option=True)
    assert str(err.value) == (
        'tool("calc"): unknown option "bogus_option". Check for a typo, or upgrade agent-lattice if '
        "this option was added in a newer version."
    )


def test_input_model_must_be_a_pydantic_model_or_schema_dict():
    with pytest.raises(ConfigError, match="pydantic BaseModel subclass or a JSON Schema dict"):
        tool("calc", "d", int, calc_handler)
    with pytest.raises(ConfigError, match="pydantic BaseModel subclass or a JSON Schema dict"):
        tool("calc", "d", BaseModel, calc_handler)  # the base class itself describes no input
    with pytest.raises(ConfigError, match="pydantic BaseModel subclass or a JSON Schema dict"):
        tool("calc", "d", CalcInput(expr="1"), calc_handler)  # an instance, not the class
    with pytest.raises(ConfigError, match='type "object"'):
        tool("calc", "d", {"type": "string"}, calc_handler)
    with pytest.raises(ConfigError, match="handler must be callable"):
        tool("calc", "d", CalcInput, "not callable")
    with pytest.raises(ConfigError, match="description"):
        tool("calc", "  ", CalcInput, calc_handler)
    with pytest.raises(ConfigError, match="is_concurrency_safe"):
        tool("calc", "d", CalcInput, calc_handler, is_concurrency_safe="yes")


def test_decorator_derives_the_model_from_the_signature_and_docstring():
    @tool
    async def search(
        query: str, limit: Annotated[int, Field(ge=1)] = 5, ctx: ToolContext | None = None
    ) -> str:
        """Search the documents.

        Longer text that is not part of the description.
        """
        return f"{query}:{limit}:{ctx.tool_use_id}"

    assert search.name == "search"
    assert search.description == "Search the documents."
    props = search.input_schema["properties"]
    assert set(props) == {"query", "limit"}  # the ToolContext parameter is not model-facing
    assert search.input_schema["required"] == ["query"]
    assert props["limit"]["minimum"] == 1


async def test_decorated_handler_receives_fields_and_context():
    @tool(name="lookup", description="Look a key up", is_concurrency_safe=True, metadata={"v": 1})
    def lookup(key: str, ctx: ToolContext) -> str:
        return f"{key}/{ctx.tool_name}/{ctx.tool_use_id}"

    assert lookup.name == "lookup" and lookup.description == "Look a key up"
    assert lookup.is_concurrency_safe is True and lookup.metadata == {"v": 1}
    parsed = lookup.parse_input({"key": "k1"})
    result = await lookup.invoke(parsed, ToolContext(tool_use_id="t1", tool_name="lookup"))
    assert result == ToolResult(content="k1/lookup/t1")


def test_decorator_needs_a_description():
    with pytest.raises(ConfigError, match="no description"):

        @tool
        def nodoc(x: int) -> str:
            return str(x)


def test_decorator_rejects_unknown_options_and_var_args():
    with pytest.raises(ConfigError, match='unknown option "bogus"'):
        tool(name="x", bogus=1)
    with pytest.raises(ConfigError, match=r"\*args"):

        @tool
        def star(*items: int) -> str:
            """Doc."""
            return ""


def test_parse_input_rules():
    t = tool("calc", "d", CalcInput, calc_handler)
    with pytest.raises(ToolInputError, match="must be a JSON object, got array"):
        t.parse_input([1, 2])
    with pytest.raises(ToolInputError, match="must be a JSON object, got string"):
        t.parse_input("1+1")
    with pytest.raises(ToolInputError) as err:
        t.parse_input({"precision": "x"})
    text = str(err.value)
    assert 'invalid input for tool "calc"' in text
    assert "expr: Field required" in text
    assert "precision:" in text
    assert t.parse_input({"expr": "1"}) == CalcInput(expr="1")

    empty = tool("ping", "d", {"type": "object", "properties": {}}, lambda i: "pong")
    assert empty.parse_input(None) == {}
    assert empty.parse_input("") == {}


def test_json_schema_tools_are_validated_with_jsonschema():
    t = tool(
        "raw",
        "Raw schema tool",
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        lambda i: str(i["n"]),
    )
    assert t.input_model is None
    assert t.parse_input({"n": 3}) == {"n": 3}
    with pytest.raises(ToolInputError, match="'n' is a required property"):
        t.parse_input({})
    with pytest.raises(ConfigError, match="invalid JSON Schema"):
        tool("bad", "d", {"type": "object", "properties": {"n": {"type": 5}}}, lambda i: "")


def test_concurrency_safety_check_rules():
    def boom(_):
        raise RuntimeError("no")

    assert tool("a", "d", CalcInput, calc_handler).check_concurrency_safe(None) is False
    assert (
        tool("a", "d", CalcInput, calc_handler, is_concurrency_safe=False).check_concurrency_safe(None)
        is False
    )
    assert (
        tool("a", "d", CalcInput, calc_handler, is_concurrency_safe=True).check_concurrency_safe(None) is True
    )
    assert (
        tool("a", "d", CalcInput, calc_handler, is_concurrency_safe=boom).check_concurrency_safe(None)
        is False
    )

    async def async_check(_):
        return True

    made = []  # the check is synchronous: an async check counts as False and its coroutine is closed
    checked = tool(
        "a",
        "d",
        CalcInput,
        calc_handler,
        is_concurrency_safe=lambda i: made.append(async_check(i)) or made[-1],
    )
    assert checked.check_concurrency_safe(None) is False
    assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED  # no "never awaited" warning
    assert (
        tool("a", "d", CalcInput, calc_handler, is_concurrency_safe=lambda i: 1).check_concurrency_safe(None)
        is False
    )
    by_input = tool("a", "d", CalcInput, calc_handler, is_concurrency_safe=lambda i: i.expr == "safe")
    assert by_input.check_concurrency_safe(CalcInput(expr="safe")) is True
    assert by_input.check_concurrency_safe(CalcInput(expr="other")) is False


def test_handler_return_values_are_normalised():
    blocks = [{"type": "text", "text": "a"}]
    assert normalize_tool_output("t", "x") == ToolResult("x")
    assert normalize_tool_output("t", blocks) == ToolResult(blocks)
    assert normalize_tool_output(
        "t", {"content": "x", "end_turn": True, "structured_result": {"a": 1}}
    ) == ToolResult("x", end_turn=True, structured_result={"a": 1})
    tr = ToolResult("y", end_turn=True)
    assert normalize_tool_output("t", tr) is tr
    with pytest.raises(ToolExecutionError, match="returned NoneType"):
        normalize_tool_output("t", None)
    with pytest.raises(ToolExecutionError, match='needs "content"'):
        normalize_tool_output("t", {"text": "x"})
    with pytest.raises(ToolExecutionError, match="item 0 is not a content block"):
        normalize_tool_output("t", ["plain string"])


async def test_full_form_handler_may_take_the_context_as_second_argument():
    seen = {}

    async def handler(inp: CalcInput, ctx: ToolContext) -> ToolResult:
        seen["ctx"] = ctx
        return ToolResult(inp.expr)

    t = tool("calc", "d", CalcInput, handler)
    ctx = ToolContext(tool_use_id="id9", tool_name="calc", runtime="RT", agent="AG")
    assert await t.invoke(t.parse_input({"expr": "1"}), ctx) == ToolResult("1")
    assert seen["ctx"] is ctx
