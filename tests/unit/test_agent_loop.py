"""The agent loop with a scripted model: events, turns, reuse, failures
(docs/architecture.md, "Core model"; ``max_turns``: docs/configure.md)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AbortError,
    APIError,
    AssistantModelMessage,
    ConcurrentQueryError,
    ConfigError,
    ResultMessage,
    ScriptedModelClient,
    create_agent,
    create_bare_agent,
    define_agent,
    is_agent_spec,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.agent.events import parse_sdk_message


class CalcInput(BaseModel):
    expr: str


def make_calc(log: list | None = None):
    def handler(inp: CalcInput) -> str:
        if log is not None:
            log.append(inp.expr)
        return str(eval(inp.expr, {}))  # test-only arithmetic

    return tool("calc", "Evaluate arithmetic", CalcInput, handler)


async def collect(agent, prompt, **options):
    return [event async for event in agent.query(prompt, **options)]


def kinds(events):
    return [e.type for e in events if e.type != "stream_event"]


async def test_text_answer_yields_system_assistant_result_and_never_echoes_the_prompt():
    client = ScriptedModelClient([text_turn("Hello there.", usage={"input_tokens": 7, "output_tokens": 3})])
    agent = create_bare_agent(model="m1", model_client=client, name="greeter")
    events = await collect(agent, "Say hello", stream=False)
    assert [e.type for e in events] == ["system", "assistant", "result"]
    system, assistant, result = events
    assert system.subtype == "init" and system.session_id == agent.session_id
    assert system.model == "m1" and system.name == "greeter" and system.tools == []
    assert assistant.message["content"] == [{"type": "text", "text": "Hello there."}]
    assert assistant.message["stop_reason"] == "end_turn"
    assert result.subtype == "success" and result.is_error is False
    assert result.result == "Hello there."
    assert result.num_turns == 1
    assert result.usage["input_tokens"] == 7 and result.usage["output_tokens"] == 3
    assert result.stop_reason == "end_turn"
    assert all("Say hello" not in str(e.model_dump()) for e in events)
    # the prompt went to the model as the first user message
    assert client.requests[0].messages == [{"role": "user", "content": "Say hello"}]
    assert client.requests[0].model == "m1"


async def test_tool_loop_records_one_user_event_per_batch_in_order():
    log: list[str] = []
    client = ScriptedModelClient(
        [
            tool_turn(("calc", {"expr": "1+1"}, "t1"), ("calc", {"expr": "2*3"}, "t2")),
            tool_turn(("calc", {"expr": "10-1"}, "t3")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=[make_calc(log)])
    events = await collect(agent, "compute", stream=False)
    assert kinds(events) == ["system", "assistant", "user", "assistant", "user", "assistant", "result"]
    first_user, second_user = [e for e in events if e.type == "user"]
    assert first_user.message == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "2"},
            {"type": "tool_result", "tool_use_id": "t2", "content": "6"},
        ],
    }
    # several tools: tool_use_result is the list of blocks; one tool: its content
    assert first_user.tool_use_result == first_user.message["content"]
    assert second_user.tool_use_result == "9"
    assert first_user.error is None
    assert log == ["1+1", "2*3", "10-1"]
    assert events[-1].num_turns == 3 and events[-1].result == "done"
    # the model saw its tool_use and our tool_result on the next request
    assert client.requests[1].messages[-1]["content"][1]["tool_use_id"] == "t2"
    assert client.requests[1].tools == [make_calc().to_model_tool()]


async def test_streaming_yields_stream_events_before_the_assistant_event():
    agent = create_bare_agent(model_client=ScriptedModelClient([text_turn("hi")]))
    events = await collect(agent, "x")  # stream defaults to True
    types = [e.type for e in events]
    assert types[0] == "system" and types[-2:] == ["assistant", "result"]
    stream_types = [e.event["type"] for e in events if e.type == "stream_event"]
    assert stream_types == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert types.index("assistant") > max(i for i, t in enumerate(types) if t == "stream_event")


async def test_stream_false_sends_no_stream_callback():
    client = ScriptedModelClient([text_turn("hi")])
    agent = create_bare_agent(model_client=client)
    events = await collect(agent, "x", stream=False)
    assert not [e for e in events if e.type == "stream_event"]
    assert client.requests[0].stream is False and client.requests[0].on_stream_event is None


async def test_events_round_trip_through_their_wire_dicts():
    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("calc", {"expr": "1"})), text_turn("ok")]),
        tools=[make_calc()],
    )
    for event in await collect(agent, "x"):
        wire = event.model_dump()
        assert wire["type"] == event.type
        assert parse_sdk_message(wire) == event


async def test_max_turns_counts_model_requests():
    turns = [tool_turn(("calc", {"expr": str(i)})) for i in range(5)]
    client = ScriptedModelClient(turns)
    agent = create_bare_agent(model_client=client, tools=[make_calc()], max_turns=2)
    events = await collect(agent, "loop", stream=False)
    result = events[-1]
    assert kinds(events) == ["system", "assistant", "user", "assistant", "user", "result"]
    assert result.subtype == "error_max_turns" and result.is_error is True
    assert result.error_type == "MaxTurnsError" and "max_turns=2" in result.error
    assert result.num_turns == 2 and len(client.requests) == 2


async def test_exactly_one_result_even_on_failure():
    agent = create_bare_agent(model_client=ScriptedModelClient([APIError("overloaded", status_code=529)]))
    events = await collect(agent, "x")
    assert [e.type for e in events] == ["system", "result"]
    result = events[-1]
    assert result.subtype == "error" and result.is_error is True
    assert result.error == "overloaded" and result.error_type == "APIError"
    assert isinstance(result.exception, APIError) and result.exception.status_code == 529
    with pytest.raises(APIError):
        result.raise_for_error()


async def test_any_client_exception_becomes_an_error_result():
    agent = create_bare_agent(model_client=ScriptedModelClient([ValueError("bad json from provider")]))
    result = await agent.prompt("x")
    assert (
        result.subtype == "error"
        and result.error == "bad json from provider"
        and result.error_type == "ValueError"
    )


async def test_calling_past_the_script_fails_loudly_naming_the_request():
    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("calc", {"expr": "1"}))]), tools=[make_calc()]
    )
    result = await agent.prompt("go")
    assert result.subtype == "error" and result.error_type == "ScriptExhaustedError"
    assert "request #2" in result.error and "only 1 turn" in result.error and "tool_result" in result.error


async def test_a_reply_with_no_content_ends_success_with_empty_text():
    client = ScriptedModelClient(
        [AssistantModelMessage(content=[], stop_reason="end_turn"), text_turn("second")]
    )
    agent = create_bare_agent(model_client=client)
    result = await agent.prompt("x")
    assert result.subtype == "success" and result.result == "" and result.is_error is False
    # the empty turn is not stored (the Messages API rejects empty assistant turns); the next query works
    assert await agent.get_history() == [{"role": "user", "content": "x"}]
    assert (await agent.prompt("y")).result == "second"


async def test_client_returning_garbage_is_an_error_result():
    result = await create_bare_agent(model_client=ScriptedModelClient([lambda r: "nope"])).prompt("x")
    assert result.subtype == "error" and "AssistantModelMessage" in result.error


async def test_sequential_reuse_keeps_history():
    client = ScriptedModelClient([text_turn("noted"), text_turn("an SDK")])
    agent = create_bare_agent(model_client=client)
    await agent.prompt("Remember my project is an SDK.")
    second = await agent.prompt("What is my project?")
    assert second.result == "an SDK" and second.num_turns == 1
    assert client.requests[1].messages == [
        {"role": "user", "content": "Remember my project is an SDK."},
        {"role": "assistant", "content": [{"type": "text", "text": "noted"}]},
        {"role": "user", "content": "What is my project?"},
    ]


async def test_a_second_concurrent_query_raises_and_the_first_is_unharmed():
    gate = asyncio.Event()
    called = asyncio.Event()

    async def slow(_request):
        called.set()
        await gate.wait()
        return AssistantModelMessage(content=[{"type": "text", "text": "first"}], stop_reason="end_turn")

    agent = create_bare_agent(model_client=ScriptedModelClient([slow, text_turn("later")]))
    first = asyncio.create_task(agent.prompt("one"))
    await called.wait()
    assert agent.running
    with pytest.raises(ConcurrentQueryError):
        await agent.prompt("two")
    with pytest.raises(ConcurrentQueryError):
        async for _ in agent.query("three"):
            pass
    gate.set()
    assert (await first).result == "first"
    # the guard released: the next query runs, and the rejected prompts never entered history
    assert (await agent.prompt("four")).result == "later"
    contents = [m["content"] for m in await agent.get_history() if m["role"] == "user"]
    assert contents == ["one", "four"]


async def test_guard_releases_after_an_error_and_after_an_abandoned_iteration():
    client = ScriptedModelClient([APIError("boom"), text_turn("a"), text_turn("b"), text_turn("c")])
    agent = create_bare_agent(model_client=client)
    assert (await agent.prompt("1")).subtype == "error"
    async with contextlib.aclosing(agent.query("2")) as it:
        async for event in it:
            if event.type == "assistant":
                break
    assert agent.running is False
    # a plain `break` without aclosing: the generator is finalised by asyncio shortly after
    async for event in agent.query("3"):
        if event.type == "assistant":
            break
    assert (await agent.prompt("4")).result == "c"


async def test_query_none_continues_from_history_ending_with_a_user_message():
    client = ScriptedModelClient([text_turn("continued")])
    agent = create_bare_agent(model_client=client)
    await agent.replace_history([{"role": "user", "content": "resume me"}])
    result = await agent.prompt(None)
    assert result.result == "continued"
    assert client.requests[0].messages == [{"role": "user", "content": "resume me"}]

    with pytest.raises(ConfigError, match="must end with a user message"):
        await agent.prompt(None)


async def test_multimodal_prompt_blocks_are_forwarded():
    client = ScriptedModelClient([text_turn("a cat")])
    blocks = [
        {"type": "text", "text": "What is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
    ]
    await create_bare_agent(model_client=client).prompt(blocks)
    assert client.requests[0].messages == [{"role": "user", "content": blocks}]


@pytest.mark.parametrize("bad", ["", "   ", [], [{"text": "no type"}], 42])
async def test_bad_prompts_raise_config_error(bad):
    agent = create_bare_agent(model_client=ScriptedModelClient([]))
    with pytest.raises(ConfigError, match="prompt"):
        await agent.prompt(bad)


def test_prompt_sync_runs_without_a_loop_and_refuses_inside_one():
    agent = create_bare_agent(model_client=ScriptedModelClient([text_turn("sync ok")]))
    result = agent.prompt_sync("x")
    assert isinstance(result, ResultMessage) and result.result == "sync ok"

    async def inside():
        with pytest.raises(RuntimeError, match="inside a running event loop"):
            agent.prompt_sync("y")

    asyncio.run(inside())


async def test_interrupt_when_idle_returns_false():
    agent = create_bare_agent(model_client=ScriptedModelClient([]))
    assert agent.interrupt() is False


async def test_add_tools_after_creation_are_offered_from_the_next_request():
    client = ScriptedModelClient([text_turn("a"), tool_turn(("calc", {"expr": "4"})), text_turn("b")])
    agent = create_bare_agent(model_client=client)
    await agent.prompt("first")
    assert client.requests[0].tools == []
    agent.add_tools([make_calc()])
    result = await agent.prompt("second")
    assert result.result == "b"
    assert [t["name"] for t in client.requests[1].tools] == ["calc"]
    with pytest.raises(ConfigError, match='duplicate tool name "calc"'):
        agent.add_tools([make_calc()])
    with pytest.raises(ConfigError, match="not a ToolDefinition"):
        agent.add_tools(["calc"])
    assert [t.name for t in agent.tools] == ["calc"]


async def test_unknown_and_mistyped_options_raise_config_error():
    with pytest.raises(ConfigError) as err:
        create_agent(bogus_option=1)
    assert str(err.value) == (
        'create_agent: unknown option "bogus_option". Check for a typo, or upgrade agent-lattice if this '
        "option was added in a newer version."
    )
    with pytest.raises(ConfigError, match='create_bare_agent: unknown option "workspace"'):
        create_bare_agent(workspace="/tmp/x")
    with pytest.raises(ConfigError, match='define_agent: option "max_turns" expects a positive integer'):
        define_agent(max_turns=0)
    with pytest.raises(
        ConfigError, match='option "request_timeout_ms" expects a positive integer number of milliseconds'
    ):
        create_agent(request_timeout_ms=-5)
    with pytest.raises(ConfigError, match='option "model" expects a string'):
        create_agent(model=3)
    with pytest.raises(ConfigError, match='option "tool_concurrency"'):
        create_agent(tool_concurrency={"mode": "safe", "max_concurrency": 0})
    with pytest.raises(ConfigError, match='duplicate tool name "calc"'):
        create_agent(tools=[make_calc(), make_calc()])
    agent = create_bare_agent(model_client=ScriptedModelClient([]))
    with pytest.raises(ConfigError, match='query: unknown option "strem"'):
        agent.query("x", strem=False)
    with pytest.raises(ConfigError, match='prompt: option "request_timeout_ms" expects a positive integer'):
        await agent.prompt("x", request_timeout_ms=0)
    with pytest.raises(ConfigError, match='option "signal" expects an AbortSignal'):
        await agent.prompt("x", signal="soon")


def test_inactive_options_are_accepted_and_stored():
    agent = create_agent(auto_compact=True, skills=[], workspace="/tmp/ws")
    assert agent.options.auto_compact is True
    assert agent.options.workspace == "/tmp/ws"
    assert create_agent(workspace=False).bare is True


async def test_define_agent_spawns_independent_sessions():
    spec = define_agent(name="worker", model_client=ScriptedModelClient([text_turn("a"), text_turn("b")]))
    assert is_agent_spec(spec) and not is_agent_spec(spec.spawn()) and not is_agent_spec("x")
    assert spec.options.name == "worker" and spec.output_schema is None
    one, two = spec.spawn(), spec.spawn()
    assert one.session_id != two.session_id
    await one.prompt("to one")
    assert await two.get_history() == []
    assert define_agent(workspace=False).spawn().bare is True


async def test_bare_agents_send_exactly_the_system_prompt():
    safe = tool("look", "Look", CalcInput, lambda i: "x", is_concurrency_safe=True)
    other = tool("calc", "Calc", CalcInput, lambda i: "y")
    bare_client = ScriptedModelClient([text_turn("a")])
    await create_bare_agent(model_client=bare_client, system_prompt="Be brief.", tools=[safe, other]).prompt(
        "x"
    )
    assert bare_client.requests[0].system == "Be brief."
    full_client = ScriptedModelClient([text_turn("a")])
    await create_agent(model_client=full_client, system_prompt="Be brief.", tools=[safe, other]).prompt("x")
    assert full_client.requests[0].system.startswith("Be brief.\n\n")
    assert "in one response" in full_client.requests[0].system
    plain_client = ScriptedModelClient([text_turn("a")])
    plain = create_agent(
        model_client=plain_client,
        system_prompt="Be brief.",
        tools=[other],
        tool_concurrency={"mode": "sequential"},
    )
    await plain.prompt("x")
    # the workspace section, but no batching note: nothing runs concurrently
    assert plain_client.requests[0].system == f"Be brief.\n\n{plain.workspace.describe()}"


async def test_request_carries_model_settings():
    client = ScriptedModelClient([text_turn("a"), text_turn("b")])
    agent = create_bare_agent(
        model_client=client,
        model="m",
        max_tokens=2000,
        thinking_config={"type": "enabled", "budget_tokens": 5000},
        reasoning_effort="low",
        request_timeout_ms=60_000,
    )
    await agent.prompt("x")
    req = client.requests[0]
    assert req.max_tokens == 2000
    assert req.thinking == {"type": "enabled", "budget_tokens": 1999}  # capped at max_tokens - 1
    assert req.reasoning_effort == "low" and req.timeout_ms == 60_000
    assert req.output_format is None
    await agent.prompt(
        "y",
        thinking_config={"type": "disabled"},
        reasoning_effort="max",
        output_format="json",
        request_timeout_ms=5_000,
    )
    req = client.requests[1]
    assert req.thinking == {"type": "disabled"} and req.reasoning_effort == "max"
    assert req.output_format == "json" and req.timeout_ms == 5_000


async def test_abort_before_start_ends_error_abort_without_a_model_call():
    from lattice_worker import AbortController

    controller = AbortController()
    controller.abort("stop")
    client = ScriptedModelClient([text_turn("never")])
    result = await create_bare_agent(model_client=client).prompt("x", signal=controller.signal)
    assert result.subtype == "error_abort" and result.is_error and result.error_type == "AbortError"
    assert "stop" in result.error and isinstance(result.exception, AbortError)
    assert client.requests == []
