"""Pinned names, defaults and rules of issues 2 and 3 that had no test that would
fail when they broke (docs/architecture.md, "Public API"; errors, tool
concurrency, hook rules, custom trace sinks, interrupting a query, tool metadata)."""

from __future__ import annotations

import asyncio
import json
import re
import threading

import pytest
from pydantic import BaseModel

import lattice_worker
from lattice_worker import (
    AbortController,
    AssistantModelMessage,
    ConfigError,
    ScriptedModelClient,
    ToolContext,
    create_agent,
    create_bare_agent,
    create_composite_agent_hooks,
    create_jsonl_history_store,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.agent.options import AgentOptions, QueryOptions
from lattice_worker.tracing import define_context_tracer


class Empty(BaseModel):
    pass


class N(BaseModel):
    n: int


async def run(agent, prompt="go", **options):
    return [e async for e in agent.query(prompt, stream=False, **options)]


# --------------------------------------------------------------------------- public names

DESIGN_AGENT_OPTIONS = (
    "api_key base_url name model system_prompt max_tokens max_turns thinking_config reasoning_effort "
    "request_timeout_ms output_schema tools tool_batch_policy hooks auto_compact tool_concurrency skills "
    "workspace permission model_client tracer history_store"
).split()
DESIGN_QUERY_OPTIONS = (
    "stream output_format thinking_config reasoning_effort request_timeout_ms signal tracer".split()
)


def test_every_design_option_is_known_and_accepted_with_a_valid_value(tmp_path):
    assert set(DESIGN_AGENT_OPTIONS) <= set(AgentOptions.model_fields)
    assert set(DESIGN_QUERY_OPTIONS) <= set(QueryOptions.model_fields)
    assert AgentOptions.model_fields["max_turns"].default == 50

    class Answer(BaseModel):
        answer: str

    values = {
        "api_key": "k",
        "base_url": "http://127.0.0.1:9",
        "name": "n",
        "model": "m",
        "system_prompt": "s",
        "max_tokens": 100,
        "max_turns": 3,
        "thinking_config": {"type": "adaptive"},
        "reasoning_effort": "high",
        "request_timeout_ms": 1000,
        "output_schema": Answer,
        "tools": [tool("t", "T", Empty, lambda _: "x")],
        "tool_batch_policy": lambda ctx: {"allowed": True},
        "hooks": {"on_tool_result": lambda ctx: None},
        "auto_compact": {"threshold_tokens": 1000},
        "tool_concurrency": {"mode": "all", "max_concurrency": 2},
        "skills": [],
        "workspace": str(tmp_path),
        "permission": lambda request: {"behavior": "allow"},
        "model_client": ScriptedModelClient([]),
        "tracer": define_context_tracer(on_event=lambda e: None),
        "history_store": create_jsonl_history_store(path=tmp_path / "h.jsonl"),
    }
    assert sorted(values) == sorted(DESIGN_AGENT_OPTIONS)
    agent = create_agent(**values)
    assert agent.options.max_turns == 3 and agent.output_schema is Answer
    assert agent.options.tool_concurrency.max_concurrency == 2
    assert create_agent().options.tool_concurrency.max_concurrency == 10  # the default, docs/tool-effects.md
    assert create_agent().options.tool_concurrency.mode == "safe"


def test_every_error_is_a_lattice_error_and_model_timeout_is_a_timeout_error():
    names = (
        "ConfigError APIError ToolExecutionError MaxTurnsError AbortError ModelTimeoutError "
        "ToolBatchRejectedError ConcurrentQueryError MissingOutputError"
    ).split()
    for name in names:
        error_class = getattr(lattice_worker, name)
        assert issubclass(error_class, lattice_worker.LatticeError), name
    assert issubclass(lattice_worker.ModelTimeoutError, TimeoutError)
    assert issubclass(ConfigError, ValueError)
    assert lattice_worker.SUBMIT_OUTPUT_TOOL_NAME == "submit_output"


# --------------------------------------------------------------------------- concurrency and abort


class Gate:
    """Handlers that count how many run at once and wait until released."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.started: list[int] = []
        self.release = asyncio.Event()

    async def handler(self, inp: N, ctx: ToolContext) -> str:
        self.active += 1
        self.peak = max(self.peak, self.active)
        self.started.append(inp.n)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return f"ran {inp.n}"
        finally:
            self.active -= 1


async def test_max_concurrency_defaults_to_ten():
    gate = Gate()
    safe = tool("s", "S", N, gate.handler, is_concurrency_safe=True)
    client = ScriptedModelClient([tool_turn(*[("s", {"n": i}) for i in range(14)]), text_turn("ok")])
    events = await run(create_bare_agent(model_client=client, tools=[safe]))
    assert gate.peak == 10
    [user] = [e for e in events if e.type == "user"]
    assert [b["content"] for b in user.message["content"]] == [f"ran {i}" for i in range(14)]


async def test_abort_lets_started_handlers_settle_and_never_starts_calls_waiting_for_a_slot():
    controller = AbortController()
    started: list[int] = []
    saw_abort: list[int] = []

    async def handler(inp: N, ctx: ToolContext) -> str:
        started.append(inp.n)
        if inp.n == 0:
            await asyncio.sleep(0)  # let call 1 start too: both slots are taken
            controller.abort("user cancelled")
        await ctx.signal.wait()
        saw_abort.append(inp.n)
        return f"settled {inp.n}"

    safe = tool("s", "S", N, handler, is_concurrency_safe=True)
    client = ScriptedModelClient(
        [tool_turn(*[("s", {"n": i}, f"c{i}") for i in range(4)]), text_turn("never")]
    )
    agent = create_bare_agent(model_client=client, tools=[safe], tool_concurrency={"max_concurrency": 2})
    events = await asyncio.wait_for(run(agent, signal=controller.signal), 10)
    assert sorted(started) == [0, 1] and sorted(saw_abort) == [0, 1]
    [user] = [e for e in events if e.type == "user"]
    blocks = user.message["content"]
    assert [b["tool_use_id"] for b in blocks] == ["c0", "c1", "c2", "c3"]
    assert [b["content"] for b in blocks[:2]] == ["settled 0", "settled 1"]
    for waiting in blocks[2:]:
        assert waiting["is_error"] is True and "aborted" in waiting["content"]
    assert events[-1].subtype == "error_abort" and len(client.requests) == 1


# --------------------------------------------------------------------------- hooks: return, do not mutate


async def test_an_on_tool_result_hook_that_mutates_its_context_changes_nothing():
    def mutating(ctx):
        ctx.result["content"] = "mutated in place"
        ctx.input["k"] = "changed"
        return None

    t = tool("t", "T", {"type": "object"}, lambda _: "original")
    client = ScriptedModelClient([tool_turn(("t", {"k": "v"}, "c1")), text_turn("ok")])
    agent = create_bare_agent(model_client=client, tools=[t], hooks={"on_tool_result": mutating})
    await agent.prompt("go")
    history = await agent.get_history()
    assert history[1]["content"][0]["input"] == {"k": "v"}
    assert history[2]["content"] == [{"type": "tool_result", "tool_use_id": "c1", "content": "original"}]
    assert client.requests[1].messages[2] == history[2]


async def test_an_on_model_request_hook_that_mutates_its_context_changes_nothing():
    def mutating(ctx):
        ctx.messages.clear()
        ctx.messages.append({"role": "user", "content": "injected by mutation"})
        return None

    client = ScriptedModelClient([text_turn("ok")])
    agent = create_bare_agent(model_client=client, hooks={"on_model_request": mutating})
    await agent.prompt("the real prompt")
    assert client.requests[0].messages == [{"role": "user", "content": "the real prompt"}]


async def test_composite_hooks_hand_each_hook_its_own_copy():
    def mutate_then_keep(ctx):
        ctx.result["content"] = "leaked"
        return None

    def replace_from_what_it_sees(ctx):
        return {**ctx.result, "content": ctx.result["content"] + "+seen"}

    def mutate_messages(ctx):
        ctx.messages.append({"role": "user", "content": "leaked"})
        return None

    def keep_messages(ctx):
        return {"messages": ctx.messages}

    hooks = create_composite_agent_hooks(
        [
            {"on_tool_result": mutate_then_keep, "on_model_request": mutate_messages},
            {"on_tool_result": replace_from_what_it_sees, "on_model_request": keep_messages},
        ]
    )
    t = tool("t", "T", Empty, lambda _: "raw")
    client = ScriptedModelClient([tool_turn(("t", {}, "c1")), text_turn("ok")])
    agent = create_bare_agent(model_client=client, tools=[t], hooks=hooks)
    await agent.prompt("go")
    assert (await agent.get_history())[2]["content"][0]["content"] == "raw+seen"
    assert "leaked" not in json.dumps([r.messages for r in client.requests])


# --------------------------------------------------------------------------- tracing, interrupt, metadata


@pytest.mark.parametrize("bad", [{"on_event": None}, {"on_event": "print"}, {"on_event": print, "flush": 3}])
def test_define_context_tracer_rejects_non_callables(bad):
    with pytest.raises(ConfigError, match="define_context_tracer"):
        define_context_tracer(**bad)


async def test_interrupt_from_another_thread_ends_the_query_interrupted():
    started = threading.Event()
    never = asyncio.Event()

    async def hang(_request):
        started.set()
        await never.wait()

    agent = create_bare_agent(model_client=ScriptedModelClient([hang]))
    answers: list[bool] = []
    thread = threading.Thread(target=lambda: started.wait(10) and answers.append(agent.interrupt()))
    thread.start()
    result = await asyncio.wait_for(agent.prompt("long task"), 10)
    thread.join(10)
    assert answers == [True]
    assert (result.subtype, result.is_error) == ("interrupted", False)
    assert await agent.get_history() == [{"role": "user", "content": "long task"}]


async def test_tool_metadata_never_reaches_the_model_request():
    t = tool("t", "T", Empty, lambda _: "x", metadata={"contract": "secret-v3"})
    client = ScriptedModelClient([tool_turn(("t", {})), text_turn("ok")])
    await create_bare_agent(model_client=client, tools=[t]).prompt("go")
    assert t.metadata == {"contract": "secret-v3"}
    for request in client.requests:
        assert request.tools == [{"name": "t", "description": "T", "input_schema": t.input_schema}]
        assert "secret-v3" not in json.dumps(request.messages)


async def test_first_end_turn_wins_and_every_call_of_the_batch_ran():
    ran: list[str] = []

    def make(name: str, end: bool):
        def handler(_):
            ran.append(name)
            return {"content": f"{name} done", "end_turn": end}

        return tool(name, name, Empty, handler)

    tools = [make("a", False), make("b", True), make("c", True)]
    client = ScriptedModelClient([tool_turn(("a", {}, "1"), ("b", {}, "2"), ("c", {}, "3"))])
    agent = create_bare_agent(model_client=client, tools=tools)
    result = await agent.prompt("go")
    assert (result.subtype, result.result) == ("success", "b done")
    assert ran == ["a", "b", "c"]
    assert [b["content"] for b in (await agent.get_history())[-1]["content"]] == [
        "a done",
        "b done",
        "c done",
    ]


async def test_jsonl_history_store_fail_on_error_decides_whether_a_store_failure_fails_the_query(tmp_path):
    # The store's path is a directory: loading it fails.
    quiet = create_bare_agent(
        model_client=ScriptedModelClient([text_turn("in memory")]),
        history_store=create_jsonl_history_store(path=tmp_path),
    )
    assert (await quiet.prompt("x")).result == "in memory"
    assert [m["role"] for m in await quiet.get_history()] == ["user", "assistant"]
    loud = create_bare_agent(
        model_client=ScriptedModelClient([text_turn("never")]),
        history_store=create_jsonl_history_store(path=tmp_path, fail_on_error=True),
    )
    with pytest.raises(OSError):
        await loud.prompt("x")
    assert loud.running is False


def test_assistant_model_message_wire_dict_carries_provider_metadata():
    message = AssistantModelMessage(
        content=[], usage={"input_tokens": 2}, stop_reason="end_turn", provider_response_id="msg_1", model="m"
    )
    assert message.to_dict() == {
        "role": "assistant",
        "content": [],
        "usage": {
            "input_tokens": 2,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
        "stop_reason": "end_turn",
        "provider_response_id": "msg_1",
        "model": "m",
    }
    assert AssistantModelMessage(content=[]).to_dict() == {"role": "assistant", "content": []}


async def test_one_tracer_numbers_events_across_queries_and_each_query_is_its_own_run():
    events: list[dict] = []
    tracer = define_context_tracer(on_event=events.append)
    agent = create_bare_agent(
        model_client=ScriptedModelClient([text_turn("a"), text_turn("b")]), tracer=tracer
    )
    await agent.prompt("one")
    await agent.prompt("two")
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    first_run, second_run = events[0]["run_id"], events[-1]["run_id"]
    assert first_run != second_run
    assert [e["type"] for e in events if e["run_id"] == second_run][0] == "run_start"
    for event in events:
        assert event["version"] == 1 and event["session_id"] == agent.session_id
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["timestamp"])
