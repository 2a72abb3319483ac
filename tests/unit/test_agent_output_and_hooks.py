"""Structured output (submit_output) and hooks."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, Field

from lattice_worker import (
    SUBMIT_OUTPUT_TOOL_NAME,
    AgentHooks,
    ConfigError,
    MissingOutputError,
    ModelRequestHookContext,
    ScriptedModelClient,
    ToolResult,
    ToolResultHookContext,
    create_agent,
    create_bare_agent,
    create_composite_agent_hooks,
    text_turn,
    tool,
    tool_turn,
)


class Answer(BaseModel):
    answer: int = Field(ge=0)
    note: str = ""


class Empty(BaseModel):
    pass


async def run(agent, prompt="go", **options):
    return [e async for e in agent.query(prompt, stream=False, **options)]


def users(events):
    return [e for e in events if e.type == "user"]


# --------------------------------------------------------------------------- structured output


async def test_invalid_then_valid_submission_ends_success_with_the_payload():
    client = ScriptedModelClient(
        [
            tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"answer": -1}, "s1")),
            tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"answer": 4, "note": "2+2"}, "s2")),
        ]
    )
    agent = create_bare_agent(model_client=client, output_schema=Answer)
    assert agent.output_schema is Answer
    events = await run(agent)
    rejected, accepted = users(events)
    [bad] = rejected.message["content"]
    assert bad["is_error"] is True and "invalid output" in bad["content"] and "answer" in bad["content"]
    assert accepted.message["content"][0]["content"] == "Structured output submitted."
    result = events[-1]
    assert result.subtype == "success" and result.is_error is False
    assert result.structured_result == {"answer": 4, "note": "2+2"}
    assert json.loads(result.result) == {"answer": 4, "note": "2+2"}
    # the injected tool carries the model's JSON schema
    offered = {t["name"]: t for t in client.requests[0].tools}
    assert offered[SUBMIT_OUTPUT_TOOL_NAME]["input_schema"] == Answer.model_json_schema()
    assert events[0].tools == [SUBMIT_OUTPUT_TOOL_NAME]


async def test_ending_without_submission_is_error_missing_output():
    agent = create_bare_agent(
        model_client=ScriptedModelClient([text_turn("The answer is 4.")]), output_schema=Answer
    )
    result = await agent.prompt("go")
    assert result.subtype == "error_missing_output" and result.is_error is True
    assert result.error_type == "MissingOutputError" and isinstance(result.exception, MissingOutputError)
    assert result.structured_result is None


async def test_an_end_turn_tool_does_not_replace_the_submission():
    done = tool("done", "Done", Empty, lambda _: ToolResult("finished", end_turn=True))
    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("done", {}))]), tools=[done], output_schema=Answer
    )
    assert (await agent.prompt("go")).subtype == "error_missing_output"


async def test_mixed_or_double_submissions_are_rejected_and_the_loop_continues():
    ran = []
    other = tool("other", "Other", Empty, lambda _: ran.append(1) or "ok")
    client = ScriptedModelClient(
        [
            tool_turn(("other", {}, "o1"), (SUBMIT_OUTPUT_TOOL_NAME, {"answer": 1}, "s1")),
            tool_turn(
                (SUBMIT_OUTPUT_TOOL_NAME, {"answer": 1}, "s2"), (SUBMIT_OUTPUT_TOOL_NAME, {"answer": 2}, "s3")
            ),
            tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"answer": 3}, "s4")),
        ]
    )
    events = await run(create_bare_agent(model_client=client, tools=[other], output_schema=Answer))
    mixed, double, final = users(events)
    for batch in (mixed, double):
        for block in batch.message["content"]:
            assert block["is_error"] is True
            assert json.loads(block["content"])["error"]["code"] == "submit_output_exclusive_batch"
    assert ran == []
    assert final.error is None
    assert events[-1].subtype == "success" and events[-1].structured_result == {"answer": 3, "note": ""}


def test_submit_output_name_is_reserved_while_output_schema_is_set():
    mine = tool(SUBMIT_OUTPUT_TOOL_NAME, "Mine", Empty, lambda _: "x")
    with pytest.raises(ConfigError, match="reserved while output_schema is set"):
        create_agent(output_schema=Answer, tools=[mine])
    agent = create_agent(output_schema=Answer)
    with pytest.raises(ConfigError, match="reserved"):
        agent.add_tools([mine])
    create_agent(tools=[mine])  # without output_schema the name is free
    with pytest.raises(ConfigError, match='option "output_schema"'):
        create_agent(output_schema=dict)


async def test_any_object_with_parse_is_an_output_schema():
    class EvenSchema:
        def json_schema(self):
            return {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}

        def parse(self, value):
            if value.get("n", 1) % 2:
                raise ValueError("n must be even")
            return {"n": value["n"]}

    client = ScriptedModelClient(
        [tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"n": 3})), tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"n": 4}))]
    )
    events = await run(create_bare_agent(model_client=client, output_schema=EvenSchema()))
    assert "n must be even" in users(events)[0].message["content"][0]["content"]
    assert events[-1].structured_result == {"n": 4}
    assert client.requests[0].tools[0]["input_schema"]["required"] == ["n"]


# --------------------------------------------------------------------------- hooks


async def test_on_tool_result_sees_successes_failures_and_blocked_calls_and_can_flip_is_error():
    seen: list[ToolResultHookContext] = []

    def boom(_):
        raise RuntimeError("bad")

    ok = tool("ok", "Ok", Empty, lambda _: "secret-token-123")
    fails = tool("fails", "Fails", Empty, boom)

    def on_tool_result(ctx: ToolResultHookContext):
        seen.append(ctx)
        if ctx.tool_name == "ok":
            return {**ctx.result, "content": ctx.result["content"].replace("secret-token-123", "[redacted]")}
        if ctx.tool_name == "fails":
            return {**ctx.result, "content": "handled", "is_error": False}
        return None

    def policy(ctx):
        names = [c["name"] for c in ctx.tool_calls]
        return {"allowed": names != ["ok", "ok"], "code": "no_pairs", "message": "one at a time"}

    client = ScriptedModelClient(
        [
            tool_turn(("ok", {"k": 1}, "a"), ("fails", {}, "b"), ("missing", {}, "c")),
            tool_turn(("ok", {}, "d"), ("ok", {}, "e")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[ok, fails],
        hooks=AgentHooks(on_tool_result=on_tool_result),
        tool_batch_policy=policy,
    )
    events = await run(agent)
    first, blocked = users(events)
    assert first.message["content"] == [
        {"type": "tool_result", "tool_use_id": "a", "content": "[redacted]"},
        {"type": "tool_result", "tool_use_id": "b", "content": "handled", "is_error": False},
        first.message["content"][2],
    ]
    assert first.message["content"][2]["is_error"] is True  # returned None: unchanged
    assert [c.tool_use_id for c in seen] == ["a", "b", "c", "d", "e"]
    assert seen[0].input == {"k": 1} and seen[0].error is None
    assert isinstance(seen[1].error, RuntimeError)
    assert seen[2].error is not None and "unknown tool" in str(seen[2].error)
    assert seen[3].error is not None and getattr(seen[3].error, "code", None) == "no_pairs"
    # the model got the rewritten results, and so did the history
    assert "[redacted]" in json.dumps(client.requests[1].messages)
    assert "secret-token-123" not in json.dumps(await agent.get_history())
    assert blocked.message["content"][0]["is_error"] is True


async def test_on_model_request_shapes_one_request_and_never_the_history():
    seen: list[ModelRequestHookContext] = []
    calc = tool("calc", "Calc", Empty, lambda _: "42")

    def on_model_request(ctx: ModelRequestHookContext):
        seen.append(ctx)
        ctx.messages.append(
            {"role": "user", "content": "mutation must not leak"}
        )  # editing the copy is harmless
        return {"messages": ctx.messages[-1:], "system_prompt": f"turn {ctx.turn}"}

    client = ScriptedModelClient([tool_turn(("calc", {})), text_turn("done")])
    agent = create_bare_agent(
        model_client=client, tools=[calc], system_prompt="base", hooks={"on_model_request": on_model_request}
    )
    await agent.prompt("question")
    assert [c.turn for c in seen] == [1, 2]
    assert seen[0].system_prompt == "base"
    assert len(seen[1].messages) == 4  # prompt, assistant, tool result + the hook's own append to its copy
    assert client.requests[0].system == "turn 1" and client.requests[1].system == "turn 2"
    assert client.requests[0].messages == [{"role": "user", "content": "mutation must not leak"}]
    history = await agent.get_history()
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant"]
    assert "mutation must not leak" not in json.dumps(history)


async def test_a_raising_hook_propagates_out_of_query_and_releases_the_agent():
    def bad_hook(ctx):
        raise PermissionError("redaction backend down")

    client = ScriptedModelClient([tool_turn(("t", {})), text_turn("next")])
    t = tool("t", "T", Empty, lambda _: "x")
    agent = create_bare_agent(model_client=client, tools=[t], hooks=AgentHooks(on_tool_result=bad_hook))
    with pytest.raises(PermissionError, match="redaction backend down"):
        await agent.prompt("go")
    assert agent.running is False
    # the failed batch's call is answered in history (withheld, never the unhooked content),
    # so the conversation stays well-formed and the Agent is usable again
    history = await agent.get_history()
    assert [m["role"] for m in history] == ["user", "assistant", "user"]
    [withheld] = history[-1]["content"]
    assert withheld["tool_use_id"] == history[1]["content"][0]["id"]
    assert withheld["is_error"] is True and "withheld" in withheld["content"]
    assert (await agent.prompt("again")).result == "next"


async def test_hook_returning_a_block_for_another_call_is_rejected():
    t = tool("t", "T", Empty, lambda _: "x")
    hooks = AgentHooks(
        on_tool_result=lambda ctx: {"type": "tool_result", "tool_use_id": "other", "content": "x"}
    )
    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("t", {}, "mine"))]), tools=[t], hooks=hooks
    )
    with pytest.raises(ConfigError, match="cannot add, drop or re-route"):
        await agent.prompt("go")


async def test_composite_hooks_chain_in_order_and_skip_none():
    order = []

    def first(ctx):
        order.append(("first", ctx.result["content"]))
        return {**ctx.result, "content": ctx.result["content"] + "+first"}

    def keep(ctx):
        order.append(("keep", ctx.result["content"]))
        return None

    async def second(ctx):
        order.append(("second", ctx.result["content"]))
        return {**ctx.result, "content": ctx.result["content"] + "+second"}

    def req_a(ctx):
        return {"system_prompt": (ctx.system_prompt or "") + "A"}

    def req_b(ctx):
        return {"system_prompt": ctx.system_prompt + "B"}

    hooks = create_composite_agent_hooks(
        [
            AgentHooks(on_tool_result=first, on_model_request=req_a),
            None,
            {"on_tool_result": keep},
            AgentHooks(on_tool_result=second, on_model_request=req_b),
        ]
    )
    t = tool("t", "T", Empty, lambda _: "raw")
    client = ScriptedModelClient([tool_turn(("t", {})), text_turn("ok")])
    events = await run(create_bare_agent(model_client=client, tools=[t], hooks=hooks, system_prompt="S"))
    assert order == [("first", "raw"), ("keep", "raw+first"), ("second", "raw+first")]
    assert users(events)[0].message["content"][0]["content"] == "raw+first+second"
    assert client.requests[0].system == "SAB"
    with pytest.raises(ConfigError):
        create_composite_agent_hooks(AgentHooks())
    with pytest.raises(ConfigError, match="must be callable"):
        AgentHooks(on_tool_result="nope")


async def test_an_async_parse_is_awaited_and_its_errors_go_back_to_the_model():
    class AsyncSchema:
        def json_schema(self):
            return {"type": "object", "properties": {"n": {"type": "integer"}}}

        async def parse(self, value):
            await asyncio.sleep(0)
            if value.get("n", 0) < 0:
                raise ValueError("n must not be negative")
            return {"n": value["n"]}

    client = ScriptedModelClient(
        [tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"n": -1})), tool_turn((SUBMIT_OUTPUT_TOOL_NAME, {"n": 2}))]
    )
    events = await run(create_bare_agent(model_client=client, output_schema=AsyncSchema()))
    [rejected] = users(events)[0].message["content"]
    assert rejected["is_error"] is True and "n must not be negative" in rejected["content"]
    result = events[-1]
    assert (result.subtype, result.structured_result, json.loads(result.result)) == (
        "success",
        {"n": 2},
        {"n": 2},
    )
