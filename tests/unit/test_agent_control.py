"""Loop control: deadlines, interrupt, usage, truncation, tracing emission,
history-store calls and the runtime seam (docs/contracts.md, "Agent loop seams
used by the team and distributed runtimes")."""

from __future__ import annotations

import asyncio
import logging

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AssistantModelMessage,
    ModelTimeoutError,
    ScriptedModelClient,
    SuspendQuery,
    ToolBatchOutcome,
    ToolContext,
    create_bare_agent,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.tracing.base import TraceContext, define_context_tracer


class Empty(BaseModel):
    pass


async def run(agent, prompt="go", **options):
    return [e async for e in agent.query(prompt, stream=False, **options)]


def hanging_client(started: asyncio.Event, then=None):
    """First request never answers (ignores timeout and signal); later ones play ``then``."""
    never = asyncio.Event()

    async def hang(_request):
        started.set()
        await never.wait()

    return ScriptedModelClient([hang, *(then or [])])


# --------------------------------------------------------------------------- deadlines


async def test_request_timeout_is_enforced_even_when_the_client_ignores_it():
    started = asyncio.Event()
    client = hanging_client(started, [text_turn("fast")])
    agent = create_bare_agent(model_client=client, request_timeout_ms=30)
    result = await agent.prompt("x")
    assert result.subtype == "error_timeout" and result.is_error is True
    assert isinstance(result.exception, ModelTimeoutError) and isinstance(result.exception, TimeoutError)
    assert "request_timeout_ms=30" in result.error
    assert client.requests[0].timeout_ms == 30
    # the abandoned call does not stop the next query
    assert (await agent.prompt("y")).result == "fast"


async def test_per_query_request_timeout_overrides_the_agent_default():
    started = asyncio.Event()
    agent = create_bare_agent(model_client=hanging_client(started), request_timeout_ms=3_600_000)
    result = await agent.prompt("x", request_timeout_ms=20)
    assert result.subtype == "error_timeout" and "request_timeout_ms=20" in result.error


# --------------------------------------------------------------------------- interrupt


async def test_interrupt_during_a_model_call_drops_only_the_in_flight_turn():
    started = asyncio.Event()
    client = hanging_client(started, [text_turn("second answer")])
    agent = create_bare_agent(model_client=client)
    await agent.replace_history(
        [
            {"role": "user", "content": "earlier"},
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        ]
    )
    pending = asyncio.create_task(agent.prompt("Draft the release notes."))
    await started.wait()
    assert agent.interrupt() is True
    result = await pending
    assert result.subtype == "interrupted" and result.is_error is False and result.error is None
    assert agent.interrupt() is False
    history = await agent.get_history()
    assert history[-1] == {"role": "user", "content": "Draft the release notes."}
    follow = await agent.prompt("Actually, cover 0.16.0 only.")
    assert follow.result == "second answer"
    # the interrupted turn left two user messages in a row: the request merges them into one
    assert [m["content"] for m in client.requests[1].messages if m["role"] == "user"] == [
        "earlier",
        [
            {"type": "text", "text": "Draft the release notes."},
            {"type": "text", "text": "Actually, cover 0.16.0 only."},
        ],
    ]


async def test_interrupt_during_a_tool_batch_lets_it_finish_and_record_results():
    def handler(_inp, ctx: ToolContext):
        assert ctx.agent.interrupt() is True
        return "batch result"

    work = tool("work", "Work", Empty, handler)
    client = ScriptedModelClient(
        [tool_turn(("work", {}, "w1"), ("work", {}, "w2")), text_turn("never requested")]
    )
    agent = create_bare_agent(model_client=client, tools=[work])
    events = await run(agent)
    assert [e.type for e in events] == ["system", "assistant", "user", "result"]
    assert events[-1].subtype == "interrupted" and events[-1].is_error is False
    assert len(client.requests) == 1
    history = await agent.get_history()
    assert history[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "w1", "content": "batch result"},
        {"type": "tool_result", "tool_use_id": "w2", "content": "batch result"},
    ]


# --------------------------------------------------------------------------- usage & truncation


async def test_usage_is_summed_over_requests_and_missing_usage_counts_zero():
    work = tool("work", "Work", Empty, lambda _: "ok")
    client = ScriptedModelClient(
        [
            tool_turn(
                ("work", {}), usage={"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 40}
            ),
            tool_turn(("work", {})),  # no usage reported
            text_turn(
                "done", usage={"input_tokens": 150, "output_tokens": 20, "cache_creation_input_tokens": 5}
            ),
        ]
    )
    result = await create_bare_agent(model_client=client, tools=[work]).prompt("go")
    assert result.usage == {
        "input_tokens": 250,
        "output_tokens": 30,
        "cache_creation_input_tokens": 5,
        "cache_read_input_tokens": 40,
    }
    assert result.stop_reason == "end_turn" and result.num_turns == 3


async def test_truncated_tool_calls_are_not_executed_and_the_loop_continues():
    ran = []
    write = tool("write", "Write", Empty, lambda _: ran.append(1) or "written")
    client = ScriptedModelClient(
        [
            tool_turn(("write", {}, "w1"), ("write", {}, "w2"), stop_reason="max_tokens"),
            text_turn("A fragment", stop_reason="max_tokens"),
        ]
    )
    events = await run(create_bare_agent(model_client=client, tools=[write]))
    [batch] = [e for e in events if e.type == "user"]
    for block in batch.message["content"]:
        assert (
            block["is_error"] is True and "max_tokens" in block["content"] and "shorter" in block["content"]
        )
    assert ran == []
    result = events[-1]
    assert (
        result.subtype == "success" and result.stop_reason == "max_tokens" and result.result == "A fragment"
    )


# --------------------------------------------------------------------------- tracing emission


def collecting_tracer(fail_on_error=False):
    events: list[dict] = []
    return events, define_context_tracer(on_event=events.append, fail_on_error=fail_on_error)


async def test_trace_of_a_two_tool_run_in_order():
    events, tracer = collecting_tracer()
    calc = tool("calc", "Evaluate arithmetic", Empty, lambda _: "4")
    look = tool("look", "Look things up", Empty, lambda _: "found")
    client = ScriptedModelClient([tool_turn(("calc", {}, "c1"), ("look", {}, "l1")), text_turn("done")])
    agent = create_bare_agent(
        model_client=client, tools=[calc, look], tracer=tracer, name="tracer-test", model="m"
    )
    await agent.prompt("trace me", stream=False)
    assert [e["type"] for e in events] == [
        "run_start",
        "user_message",
        "model_request",
        "assistant_message",
        "tool_use",
        "tool_use",
        "tool_result",
        "tool_result",
        "user_message",
        "model_request",
        "assistant_message",
        "result",
    ]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert {e["session_id"] for e in events} == {agent.session_id}
    assert len({e["run_id"] for e in events}) == 1
    assert events[0]["source"] == {"kind": "agent", "name": "tracer-test"}
    assert events[0]["data"]["model"] == "m" and events[0]["data"]["tools"] == ["calc", "look"]
    assert events[1]["data"]["message"] == {"role": "user", "content": "trace me"}
    assert events[2]["data"]["stream"] is False and events[2]["data"]["tools"] == ["calc", "look"]
    assert events[4]["data"] == {
        "tool_use_id": "c1",
        "name": "calc",
        "input": {},
        "description": "Evaluate arithmetic",
    }
    assert events[7]["data"]["result"] == {"type": "tool_result", "tool_use_id": "l1", "content": "found"}
    assert events[-1]["data"]["subtype"] == "success" and events[-1]["data"]["result"] == "done"


async def test_hooks_run_before_their_trace_events():
    events, tracer = collecting_tracer()
    t = tool("t", "T", Empty, lambda _: "raw")
    hooks = {
        "on_tool_result": lambda ctx: {**ctx.result, "content": "hooked"},
        "on_model_request": lambda ctx: {"system_prompt": "hooked system"},
    }
    client = ScriptedModelClient([tool_turn(("t", {})), text_turn("ok")])
    await create_bare_agent(model_client=client, tools=[t], tracer=tracer, hooks=hooks).prompt("x")
    [tool_result] = [e for e in events if e["type"] == "tool_result"]
    assert tool_result["data"]["result"]["content"] == "hooked"
    assert all(e["data"]["system_prompt"] == "hooked system" for e in events if e["type"] == "model_request")


async def test_query_tracer_overrides_and_trace_context_sets_session_and_source():
    agent_events, agent_tracer = collecting_tracer()
    query_events, query_tracer = collecting_tracer()
    agent = create_bare_agent(
        model_client=ScriptedModelClient([text_turn("a"), text_turn("b")]), tracer=agent_tracer
    )
    await agent.prompt("one", tracer=query_tracer)
    assert agent_events == [] and [e["type"] for e in query_events][0] == "run_start"
    context = TraceContext(
        session_id="team-session",
        source={"kind": "team_member", "name": "searcher"},
        parent_run_id="parent-1",
    )
    await agent.prompt("two", trace_context=context)
    assert {e["session_id"] for e in agent_events} == {"team-session"}
    assert agent_events[0]["source"] == {"kind": "team_member", "name": "searcher"}
    assert agent_events[0]["parent_run_id"] == "parent-1"
    assert agent_events[0]["run_id"] == context.run_id


async def test_failing_tracer_is_ignored_unless_fail_on_error(caplog):
    def broken(_event):
        raise OSError("disk full")

    quiet = define_context_tracer(on_event=broken)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.tracing"):
        result = await create_bare_agent(
            model_client=ScriptedModelClient([text_turn("fine")]), tracer=quiet
        ).prompt("x")
    assert result.subtype == "success" and "context tracer failed" in caplog.text
    loud = define_context_tracer(on_event=broken, fail_on_error=True)
    with pytest.raises(OSError, match="disk full"):
        await create_bare_agent(model_client=ScriptedModelClient([text_turn("x")]), tracer=loud).prompt("x")


# --------------------------------------------------------------------------- history store calls


class MemoryStore:
    def __init__(self, initial=None, *, fail=None, fail_on_error=False):
        self.saved = list(initial or [])
        self.calls: list[str] = []
        self.fail = fail or set()
        self.fail_on_error = fail_on_error

    async def load(self):
        self.calls.append("load")
        if "load" in self.fail:
            raise OSError("load failed")
        return list(self.saved)

    def append(self, message):
        self.calls.append("append")
        if "append" in self.fail:
            raise OSError("append failed")
        self.saved.append(message)

    def replace(self, messages):
        self.calls.append("replace")
        self.saved = list(messages)


async def test_history_store_load_once_append_each_message_replace_on_replace_history():
    store = MemoryStore(
        [
            {"role": "user", "content": "old"},
            {"role": "assistant", "content": [{"type": "text", "text": "old answer"}]},
        ]
    )
    work = tool("work", "Work", Empty, lambda _: "ok")
    client = ScriptedModelClient([tool_turn(("work", {}, "w")), text_turn("one"), text_turn("two")])
    agent = create_bare_agent(model_client=client, tools=[work], history_store=store)
    await agent.prompt("new")
    await agent.prompt("again")
    assert store.calls == ["load"] + ["append"] * 4 + ["append"] * 2
    assert client.requests[0].messages[:2] == store.saved[:2]
    assert store.saved == await agent.get_history()
    await agent.replace_history([{"role": "user", "content": "fresh"}])
    assert store.calls[-1] == "replace" and store.saved == [{"role": "user", "content": "fresh"}]


async def test_history_store_errors_are_logged_unless_fail_on_error(caplog):
    store = MemoryStore(fail={"load", "append"})
    with caplog.at_level(logging.WARNING, logger="lattice_worker.agent"):
        result = await create_bare_agent(
            model_client=ScriptedModelClient([text_turn("fine")]), history_store=store
        ).prompt("x")
    assert result.subtype == "success" and "history store load failed" in caplog.text
    strict = MemoryStore(fail={"append"}, fail_on_error=True)
    agent = create_bare_agent(model_client=ScriptedModelClient([text_turn("x")]), history_store=strict)
    with pytest.raises(OSError, match="append failed"):
        await agent.prompt("x")
    assert agent.running is False


# --------------------------------------------------------------------------- runtime seam


async def test_runtime_after_tool_batch_injects_messages_before_the_next_request():
    seen: list[ToolBatchOutcome] = []
    events_seen_before_callback: list[str] = []
    trace_events, tracer = collecting_tracer()

    class Runtime:
        async def after_tool_batch(self, outcome: ToolBatchOutcome):
            seen.append(outcome)
            events_seen_before_callback.append(last_event[0])
            return [{"role": "user", "content": "report: member finished"}]

    handoff = tool("handoff", "Handoff", Empty, lambda _inp, ctx: f"runtime={ctx.runtime is runtime}")
    runtime = Runtime()
    client = ScriptedModelClient([tool_turn(("handoff", {}, "h1")), text_turn("thanks")])
    agent = create_bare_agent(model_client=client, tools=[handoff], tracer=tracer)
    last_event = [""]
    async for event in agent.query("delegate", runtime=runtime, stream=False):
        last_event[0] = event.type
    [outcome] = seen
    assert outcome.agent is agent
    assert outcome.calls == [{"type": "tool_use", "id": "h1", "name": "handoff", "input": {}}]
    assert outcome.results == [{"type": "tool_result", "tool_use_id": "h1", "content": "runtime=True"}]
    assert events_seen_before_callback == ["user"]
    # the injected report joins the tool results' user turn, after them (one user message)
    assert client.requests[1].messages[-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "h1", "content": "runtime=True"},
            {"type": "text", "text": "report: member finished"},
        ],
    }
    injected = [e for e in trace_events if e["type"] == "user_message"][-1]
    assert injected["data"]["message"]["content"] == "report: member finished"


async def test_a_runtime_that_wants_no_stream_events_gets_none_and_the_request_still_streams():
    class Quiet:
        wants_stream_events = False

        async def after_tool_batch(self, outcome: ToolBatchOutcome):
            assert outcome.usage is not None and set(outcome.usage) >= {"input_tokens", "output_tokens"}
            return None

    work = tool("work", "Work", Empty, lambda _: "done")
    turns = [tool_turn(("work", {}, "w1")), text_turn("finished")]
    loud, quiet = ScriptedModelClient(list(turns)), ScriptedModelClient(list(turns))
    streamed = [e async for e in create_bare_agent(model_client=loud, tools=[work]).query("go")]
    events = [
        e async for e in create_bare_agent(model_client=quiet, tools=[work]).query("go", runtime=Quiet())
    ]
    assert "stream_event" in [e.type for e in streamed]
    assert [e.type for e in events] == [e.type for e in streamed if e.type != "stream_event"]
    assert events[-1].result == streamed[-1].result == "finished"
    assert all(r.stream and r.on_stream_event is None for r in quiet.requests)


async def test_suspend_query_ends_suspended_and_query_none_resumes():
    class Suspending:
        def after_tool_batch(self, outcome):
            raise SuspendQuery("waiting for members")

    work = tool("work", "Work", Empty, lambda _: "accepted")
    client = ScriptedModelClient([tool_turn(("work", {}, "w1")), text_turn("all reports in")])
    agent = create_bare_agent(model_client=client, tools=[work])
    events = await run(agent, runtime=Suspending())
    result = events[-1]
    assert [e.type for e in events] == ["system", "assistant", "user", "result"]
    assert result.subtype == "suspended" and result.is_error is False
    history = await agent.get_history()
    assert history[-1]["content"][0]["tool_use_id"] == "w1"
    resumed = await agent.prompt(None)
    assert resumed.subtype == "success" and resumed.result == "all reports in"


async def test_thinking_blocks_are_sent_back_unchanged():
    client = ScriptedModelClient(
        [
            AssistantModelMessage(
                content=[
                    {"type": "thinking", "thinking": "let me see", "signature": "sig-123"},
                    {"type": "tool_use", "id": "t1", "name": "work", "input": {}},
                ],
                stop_reason="tool_use",
            ),
            text_turn("done"),
        ]
    )
    work = tool("work", "Work", Empty, lambda _: "ok")
    await create_bare_agent(model_client=client, tools=[work]).prompt("x")
    assert client.requests[1].messages[1]["content"][0] == {
        "type": "thinking",
        "thinking": "let me see",
        "signature": "sig-123",
    }
