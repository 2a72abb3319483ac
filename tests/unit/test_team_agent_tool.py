"""Supervisor delegation with ``agent_tool`` (no mailbox involved).

Tool input and modes, template (``AgentSpec``) vs
session targets, structured child output (inheritance, assembly-time checks,
``child_output_invalid:``, passthrough without a schema), typed delegation.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import (
    ConfigError,
    ModelRequest,
    ScriptedModelClient,
    ToolResult,
    agent_tool,
    create_agent,
    define_agent,
    text_turn,
    tool,
    tool_turn,
)


class Findings(BaseModel):
    files: list[str]
    notes: str


class SameShape(BaseModel):
    files: list[str]
    notes: str


class OtherShape(BaseModel):
    files: list[str]


def results(request: ModelRequest) -> list[dict[str, Any]]:
    return [b for b in request.messages[-1]["content"] if b.get("type") == "tool_result"]


def error_text(block: dict[str, Any]) -> str:
    """The error message of an error tool_result, without the loop's ``Error: `` prefix."""
    assert block.get("is_error") is True, block
    content = block["content"]
    assert content.startswith("Error: ")
    return content[len("Error: ") :]


def verbatim_error(block: dict[str, Any]) -> str:
    """The content of an error tool_result a tool set itself (``ToolResult(is_error=True)``): no prefix."""
    assert block.get("is_error") is True, block
    assert isinstance(block["content"], str)
    assert not block["content"].startswith("Error: ")
    return block["content"]


async def supervise(tool_def: Any, *calls: dict[str, Any]) -> tuple[ScriptedModelClient, Any]:
    client = ScriptedModelClient(
        [tool_turn(*[(tool_def.name, c) for c in calls]), text_turn("supervisor done")]
    )
    supervisor = create_agent(name="supervisor", model_client=client, tools=[tool_def])
    result = await supervisor.prompt("go", stream=False)
    return client, result


async def test_spec_target_spawns_a_fresh_session_per_call() -> None:
    child_client = ScriptedModelClient(lambda r: text_turn(f"answer #{len(r.messages)}"))
    explorer = agent_tool("explore", define_agent(name="explorer", model_client=child_client))
    assert "fresh agent session" in explorer.description and "self-contained" in explorer.description
    assert explorer.kind == "agent_tool" and explorer.is_concurrency_safe is True
    client, result = await supervise(
        explorer,
        {"mode": "ask", "task": "inspect a"},
        {
            "mode": "ask",
            "task": "inspect b",
            "expected_output": "a file list",
            "acceptance_criteria": ["short"],
        },
    )
    assert result.subtype == "success"
    assert [b["content"] for b in results(client.requests[1])] == ["answer #1", "answer #1"]
    prompts = sorted(r.messages[0]["content"] for r in child_client.requests)
    assert prompts == [
        "inspect a",
        "inspect b\n\nExpected output: a file list\n\nAcceptance criteria:\n- short",
    ]


async def test_session_target_keeps_history_between_calls() -> None:
    child_client = ScriptedModelClient(lambda r: text_turn(f"seen {len(r.messages)} messages"))
    child = create_agent(name="planner", model_client=child_client)
    planner = agent_tool("plan", child)
    assert "keeps its conversation across calls" in planner.description
    assert planner.is_concurrency_safe is False
    client = ScriptedModelClient(
        [
            tool_turn(("plan", {"mode": "ask", "task": "first"})),
            tool_turn(("plan", {"mode": "ask", "task": "second"})),
            text_turn("done"),
        ]
    )
    await create_agent(name="sup", model_client=client, tools=[planner]).prompt("go", stream=False)
    assert results(client.requests[1])[0]["content"] == "seen 1 messages"
    assert results(client.requests[2])[0]["content"] == "seen 3 messages"


async def test_handoff_and_observe_are_error_results_and_the_child_never_runs() -> None:
    child_client = ScriptedModelClient([])
    helper = agent_tool("helper", create_agent(name="h", model_client=child_client))
    client, result = await supervise(
        helper, {"mode": "handoff", "task": "x"}, {"mode": "observe", "task": "y"}
    )
    handoff, observe = results(client.requests[1])
    assert 'mode "handoff" needs a team runtime' in error_text(handoff)
    assert "unsupported" in error_text(observe)
    assert child_client.requests == []
    assert result.result == "supervisor done"


async def test_child_output_schema_is_inherited_and_returned_as_json() -> None:
    payload = {"files": ["a.py"], "notes": "entry point"}
    child = define_agent(
        name="explorer",
        output_schema=Findings,
        model_client=ScriptedModelClient(lambda r: tool_turn(("submit_output", payload))),
    )
    explore = agent_tool("explore", child)
    assert "structured output as JSON" in explore.description and '"files"' in explore.description
    client, _ = await supervise(explore, {"mode": "ask", "task": "find files"})
    block = results(client.requests[1])[0]
    assert not block.get("is_error")
    assert json.loads(block["content"]) == payload


async def test_missing_or_failed_child_submission_is_child_output_invalid() -> None:
    never_submits = define_agent(
        name="lazy",
        output_schema=Findings,
        model_client=ScriptedModelClient(lambda r: text_turn("no json today")),
    )
    client, _ = await supervise(agent_tool("lazy", never_submits), {"mode": "ask", "task": "x"})
    text = verbatim_error(results(client.requests[1])[0])
    assert text.startswith("child_output_invalid: error_missing_output: ")

    keeps_failing = define_agent(
        name="wrong",
        output_schema=Findings,
        max_turns=2,
        model_client=ScriptedModelClient(lambda r: tool_turn(("submit_output", {"files": "not a list"}))),
    )
    client, _ = await supervise(agent_tool("wrong", keeps_failing), {"mode": "ask", "task": "x"})
    text = verbatim_error(results(client.requests[1])[0])
    assert text.startswith("child_output_invalid: error_max_turns: ")


async def test_explicit_output_schema_must_match_the_target() -> None:
    child = define_agent(name="c", output_schema=Findings, model_client=ScriptedModelClient([]))
    assert agent_tool("same_object", child, output_schema=Findings).name == "same_object"
    assert agent_tool("same_shape", child, output_schema=SameShape).name == "same_shape"
    with pytest.raises(ConfigError, match=r'^agent_tool\("mismatch"\): output_schema does not match') as info:
        agent_tool("mismatch", child, output_schema=OtherShape)
    assert "Share one schema object" in str(info.value)


def _ending_child(name: str, structured: Any) -> Any:
    @tool(name="finish", description="Finish with a structured result.")
    def finish() -> ToolResult:
        return ToolResult(content="finished", end_turn=True, structured_result=structured)

    return define_agent(
        name=name, tools=[finish], model_client=ScriptedModelClient(lambda r: tool_turn(("finish", {})))
    )


async def test_parent_only_schema_validates_the_child_structured_result() -> None:
    good = agent_tool("good", _ending_child("g", {"files": ["x"], "notes": "n"}), output_schema=Findings)
    client, _ = await supervise(good, {"mode": "ask", "task": "t"})
    assert json.loads(results(client.requests[1])[0]["content"]) == {"files": ["x"], "notes": "n"}

    bad = agent_tool("bad", _ending_child("b", {"files": 3}), output_schema=Findings)
    client, _ = await supervise(bad, {"mode": "ask", "task": "t"})
    assert verbatim_error(results(client.requests[1])[0]).startswith(
        "child_output_invalid: schema_mismatch: "
    )

    plain = agent_tool(
        "plain",
        define_agent(name="p", model_client=ScriptedModelClient(lambda r: text_turn("prose"))),
        output_schema=Findings,
    )
    client, _ = await supervise(plain, {"mode": "ask", "task": "t"})
    assert verbatim_error(results(client.requests[1])[0]) == (
        "child_output_invalid: missing_output: the child ended without submitting structured output"
    )


async def test_structured_result_passes_through_without_any_schema() -> None:
    passthrough = agent_tool("pt", _ending_child("c", {"verdict": "ok", "score": 3}))
    assert "JSON" not in passthrough.description
    client, _ = await supervise(passthrough, {"mode": "ask", "task": "t"})
    block = results(client.requests[1])[0]
    assert not block.get("is_error") and json.loads(block["content"]) == {"verdict": "ok", "score": 3}


class CaseInput(BaseModel):
    case_summary: str
    documents: list[str]


async def test_typed_delegation_maps_validated_input_and_rejects_invalid_input() -> None:
    child_client = ScriptedModelClient(lambda r: text_turn("verdict: fine"))
    judge = agent_tool(
        "judge",
        define_agent(name="judge", model_client=child_client),
        input_schema=CaseInput,
        map_input=lambda data: f"Case: {data.case_summary}\nDocs: {', '.join(data.documents)}",
    )
    assert set(judge.input_schema["properties"]) == {"case_summary", "documents"}
    assert "mode" not in judge.input_schema["properties"]
    client, _ = await supervise(
        judge, {"case_summary": "x"}, {"case_summary": "theft", "documents": ["d1", "d2"]}
    )
    invalid, valid = results(client.requests[1])
    assert "documents" in error_text(invalid)
    assert valid["content"] == "verdict: fine"
    assert [r.messages[0]["content"] for r in child_client.requests] == ["Case: theft\nDocs: d1, d2"]


def test_typed_delegation_needs_both_halves_and_options_are_strict() -> None:
    child = define_agent(name="c", model_client=ScriptedModelClient([]))
    with pytest.raises(ConfigError, match="input_schema needs map_input"):
        agent_tool("t", child, input_schema=CaseInput)
    with pytest.raises(ConfigError, match="map_input needs input_schema"):
        agent_tool("t", child, map_input=lambda d: "x")
    with pytest.raises(ConfigError, match=r'^agent_tool\("t"\): unknown option "mode"'):
        agent_tool("t", child, mode="ask")
    with pytest.raises(ConfigError, match="invalid name"):
        agent_tool("has space", child)
    with pytest.raises(ConfigError, match="target must be"):
        agent_tool("t", 42)


async def test_host_agent_like_target_and_metadata_passthrough() -> None:
    class Host:
        output_schema = Findings  # host declarations are not readable: nothing is inherited

        async def prompt(self, text: str) -> str:
            return f"host did: {text}"

    host_tool = agent_tool("host", Host(), metadata={"contract": "v2"})
    assert host_tool.metadata == {"contract": "v2"}
    assert "metadata" not in host_tool.to_model_tool()
    client, _ = await supervise(host_tool, {"mode": "ask", "task": "wave"})
    assert results(client.requests[1])[0]["content"] == "host did: wave"


async def test_tool_result_is_error_reaches_the_model_verbatim_and_never_ends_the_turn() -> None:
    """The loop seam agent_tool relies on: ``ToolResult(is_error=True)`` (or a dict with
    ``is_error``) is an error tool_result whose content is exactly what the tool returned."""
    from lattice_worker import AgentHooks

    @tool(name="pinned", description="Fails with a pinned text.")
    def pinned() -> ToolResult:
        return ToolResult(content="child_output_invalid: x: y", is_error=True, end_turn=True)

    @tool(name="as_dict", description="Fails through a dict.")
    def as_dict() -> dict[str, Any]:
        return {"content": "code_42: nope", "is_error": True}

    seen: list[Any] = []
    client = ScriptedModelClient([tool_turn(("pinned", {}), ("as_dict", {})), text_turn("recovered")])
    agent = create_agent(
        name="a",
        model_client=client,
        tools=[pinned, as_dict],
        hooks=AgentHooks(on_tool_result=lambda ctx: seen.append(ctx.error) and None),
    )
    events = [e async for e in agent.query("go", stream=False)]
    first, second = results(client.requests[1])
    assert first == {
        "type": "tool_result",
        "tool_use_id": first["tool_use_id"],
        "content": "child_output_invalid: x: y",
        "is_error": True,
    }
    assert second["content"] == "code_42: nope" and second["is_error"] is True
    user = next(e for e in events if e.type == "user")
    assert user.error == "child_output_invalid: x: y"
    assert [str(e) for e in seen] == ["child_output_invalid: x: y", "code_42: nope"]
    assert events[-1].subtype == "success" and events[-1].result == "recovered"  # end_turn was ignored


async def test_live_agent_target_schema_is_inherited_and_block_prompts_pass_through() -> None:
    payload = {"files": ["b.py"], "notes": "live"}
    child_client = ScriptedModelClient(lambda r: tool_turn(("submit_output", payload)))
    live = create_agent(name="live", output_schema=Findings, model_client=child_client)
    inherited = agent_tool("live", live)
    assert '"notes"' in inherited.description
    client, _ = await supervise(inherited, {"mode": "ask", "task": "t"})
    assert json.loads(results(client.requests[1])[0]["content"]) == payload
    with pytest.raises(ConfigError, match="does not match"):
        agent_tool("live2", live, output_schema=OtherShape)

    blocks_client = ScriptedModelClient(lambda r: text_turn("saw blocks"))
    typed = agent_tool(
        "typed",
        define_agent(name="b", model_client=blocks_client),
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        map_input=lambda data: [{"type": "text", "text": f"question: {data['q']}"}],
    )
    client, _ = await supervise(typed, {"q": "why"}, {"q": 3})
    ok, invalid = results(client.requests[1])
    assert ok["content"] == "saw blocks" and invalid["is_error"] is True
    assert [r.messages[0]["content"] for r in blocks_client.requests] == [
        [{"type": "text", "text": "question: why"}]
    ]
