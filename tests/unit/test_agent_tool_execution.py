"""Tool execution inside the loop: validation, failures, end_turn, concurrency,
batch policy, permissions (docs/tool-effects.md)."""

from __future__ import annotations

import asyncio
import json

from pydantic import BaseModel

from lattice_worker import (
    AbortController,
    AbortSignal,
    PermissionRequest,
    ScriptedModelClient,
    ToolContext,
    ToolDefinition,
    ToolResult,
    create_bare_agent,
    text_turn,
    tool,
    tool_turn,
)


class N(BaseModel):
    n: int


class Empty(BaseModel):
    pass


async def run(agent, prompt="go", **options):
    return [e async for e in agent.query(prompt, stream=False, **options)]


def users(events):
    return [e for e in events if e.type == "user"]


def blocks_of(event):
    return event.message["content"]


# --------------------------------------------------------------------------- validation & failures


async def test_invalid_input_becomes_an_error_result_and_the_handler_never_runs():
    calls = []
    double = tool("double", "Double n", N, lambda i: calls.append(i.n) or str(i.n * 2))
    client = ScriptedModelClient(
        [tool_turn(("double", {"n": "many"}, "t1")), tool_turn(("double", {"n": 4}, "t2")), text_turn("8")]
    )
    events = await run(create_bare_agent(model_client=client, tools=[double]))
    first, second = users(events)
    [block] = blocks_of(first)
    assert block["is_error"] is True and block["tool_use_id"] == "t1"
    assert 'invalid input for tool "double"' in block["content"] and "n:" in block["content"]
    assert first.error.startswith('invalid input for tool "double"')
    assert blocks_of(second) == [{"type": "tool_result", "tool_use_id": "t2", "content": "8"}]
    assert calls == [4]
    assert events[-1].subtype == "success"


async def test_handler_exception_is_an_error_result_and_the_loop_continues():
    def explode(_):
        raise ValueError("disk on fire")

    boom = tool("boom", "Fails", Empty, explode)
    ok = tool("ok", "Works", Empty, lambda _: "fine")
    client = ScriptedModelClient([tool_turn(("boom", {}, "a"), ("ok", {}, "b")), text_turn("recovered")])
    events = await run(create_bare_agent(model_client=client, tools=[boom, ok]))
    [batch] = users(events)
    failed, good = blocks_of(batch)
    assert failed["is_error"] is True
    assert failed["content"] == 'Error: tool "boom" failed: ValueError: disk on fire'
    assert good == {"type": "tool_result", "tool_use_id": "b", "content": "fine"}
    assert batch.error == "disk on fire"
    assert events[-1].result == "recovered" and events[-1].subtype == "success"


async def test_unknown_tool_and_non_object_input_and_empty_input():
    seen = []
    ping = tool("ping", "Ping", Empty, lambda i: seen.append(i) or "pong")
    client = ScriptedModelClient(
        [
            tool_turn(("nope", {}, "u1"), ("ping", [1, 2], "u2"), ("ping", None, "u3"), ("ping", "", "u4")),
            text_turn("ok"),
        ]
    )
    events = await run(create_bare_agent(model_client=client, tools=[ping]))
    unknown, not_object, empty_none, empty_str = blocks_of(users(events)[0])
    assert (
        unknown["is_error"] and 'unknown tool "nope"' in unknown["content"] and "ping" in unknown["content"]
    )
    assert (
        not_object["is_error"]
        and 'tool "ping" was not run: the input must be a JSON object, got array' in not_object["content"]
    )
    assert empty_none == {"type": "tool_result", "tool_use_id": "u3", "content": "pong"}
    assert empty_str == {"type": "tool_result", "tool_use_id": "u4", "content": "pong"}
    assert seen == [Empty(), Empty()]
    assert users(events)[0].error.startswith('unknown tool "nope"')


async def test_unsupported_handler_return_is_an_error_result():
    silent = tool("silent", "Returns nothing", Empty, lambda _: None)
    client = ScriptedModelClient([tool_turn(("silent", {})), text_turn("ok")])
    events = await run(create_bare_agent(model_client=client, tools=[silent]))
    [block] = blocks_of(users(events)[0])
    assert block["is_error"] and "returned NoneType" in block["content"]


async def test_content_block_results_and_dict_results():
    img = [
        {"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}},
    ]
    blocks = tool("blocks", "Blocks", Empty, lambda _: img)
    as_dict = tool("as_dict", "Dict", Empty, lambda _: {"content": "from dict"})
    client = ScriptedModelClient([tool_turn(("blocks", {}, "b"), ("as_dict", {}, "d")), text_turn("ok")])
    events = await run(create_bare_agent(model_client=client, tools=[blocks, as_dict]))
    assert blocks_of(users(events)[0]) == [
        {"type": "tool_result", "tool_use_id": "b", "content": img},
        {"type": "tool_result", "tool_use_id": "d", "content": "from dict"},
    ]


async def test_handlers_see_their_context():
    seen: list[ToolContext] = []

    async def handler(_inp, ctx: ToolContext):
        seen.append(ctx)
        return "ok"

    probe = tool("probe", "Probe", Empty, handler)
    runtime = object()
    controller = AbortController()
    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("probe", {}, "p1")), text_turn("x")]), tools=[probe]
    )
    await run(agent, runtime=runtime, signal=controller.signal)
    [ctx] = seen
    assert ctx.tool_use_id == "p1" and ctx.tool_name == "probe"
    assert ctx.agent is agent and ctx.runtime is runtime and ctx.signal is controller.signal


# --------------------------------------------------------------------------- end_turn


async def test_end_turn_records_the_whole_batch_and_skips_the_next_model_call():
    finish = tool(
        "finish",
        "Final answer",
        Empty,
        lambda _: ToolResult("the answer", end_turn=True, structured_result={"a": 1}),
    )
    other = tool("other", "Other", Empty, lambda _: "side work")
    late = tool("late", "Another ender", Empty, lambda _: ToolResult("second ender", end_turn=True))
    client = ScriptedModelClient([tool_turn(("other", {}, "o"), ("finish", {}, "f"), ("late", {}, "l"))])
    agent = create_bare_agent(model_client=client, tools=[finish, other, late])
    events = await run(agent)
    result = events[-1]
    assert [e.type for e in events] == ["system", "assistant", "user", "result"]
    assert result.subtype == "success" and result.result == "the answer"
    assert result.structured_result == {"a": 1}
    assert len(client.requests) == 1
    history = await agent.get_history()
    assert [b["tool_use_id"] for b in history[-1]["content"]] == ["o", "f", "l"]


async def test_structured_result_without_end_turn_is_ignored():
    half = tool("half", "Half", Empty, lambda _: ToolResult("x", structured_result={"ignored": True}))
    client = ScriptedModelClient([tool_turn(("half", {})), text_turn("final")])
    result = await create_bare_agent(model_client=client, tools=[half]).prompt("go")
    assert result.result == "final" and result.structured_result is None


async def test_end_turn_text_from_content_blocks():
    blocky = tool(
        "blocky",
        "B",
        Empty,
        lambda _: ToolResult([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], end_turn=True),
    )
    result = await create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("blocky", {}))]), tools=[blocky]
    ).prompt("go")
    assert result.result == "ab"


# --------------------------------------------------------------------------- concurrency


class Tracker:
    """Counts handlers in flight; each handler yields to the loop a few times."""

    def __init__(self) -> None:
        self.active = 0
        self.peak = 0
        self.log: list[str] = []

    def make(self, name: str, *, safe=None) -> ToolDefinition:
        async def handler(inp: N) -> str:
            self.active += 1
            self.peak = max(self.peak, self.active)
            self.log.append(f"start:{name}{inp.n}")
            for _ in range(5):
                await asyncio.sleep(0)
            self.log.append(f"end:{name}{inp.n}")
            self.active -= 1
            return f"{name}{inp.n}"

        return tool(name, f"{name} tool", N, handler, is_concurrency_safe=safe)


async def run_batch(tracker_tools, calls, **agent_options):
    client = ScriptedModelClient([tool_turn(*calls), text_turn("done")])
    agent = create_bare_agent(model_client=client, tools=tracker_tools, **agent_options)
    events = await run(agent)
    return [b["content"] for b in blocks_of(users(events)[0])]


async def test_safe_mode_overlaps_safe_calls_up_to_max_concurrency():
    t = Tracker()
    contents = await run_batch([t.make("s", safe=True)], [("s", {"n": i}) for i in range(5)])
    assert t.peak == 5
    assert contents == ["s0", "s1", "s2", "s3", "s4"]

    t2 = Tracker()
    await run_batch(
        [t2.make("s", safe=True)],
        [("s", {"n": i}) for i in range(5)],
        tool_concurrency={"max_concurrency": 2},
    )
    assert t2.peak == 2


async def test_unsafe_or_undeclared_calls_run_alone():
    t = Tracker()
    tools = [t.make("s", safe=True), t.make("u")]
    await run_batch(
        tools, [("s", {"n": 1}), ("s", {"n": 2}), ("u", {"n": 3}), ("s", {"n": 4}), ("s", {"n": 5})]
    )
    log = t.log
    # the unsafe call starts after both earlier safe calls ended, and ends before the later ones start
    assert log.index("start:u3") > max(log.index("end:s1"), log.index("end:s2"))
    assert log.index("end:u3") < min(log.index("start:s4"), log.index("start:s5"))
    assert log.index("start:s2") < log.index("end:s1")  # s1 and s2 overlapped
    assert t.peak == 2


async def test_is_concurrency_safe_false_raising_or_invalid_input_is_sequential():
    def raising(_):
        raise RuntimeError("cannot tell")

    for safe in (False, raising, lambda inp: inp.n > 100):
        t = Tracker()
        await run_batch([t.make("s", safe=safe)], [("s", {"n": 1}), ("s", {"n": 2}), ("s", {"n": 3})])
        assert t.peak == 1, safe
    t = Tracker()
    contents = await run_batch([t.make("s", safe=True)], [("s", {"n": "bad"}), ("s", {"n": 2})])
    assert "invalid input" in contents[0] and contents[1] == "s2"


async def test_sequential_mode_and_all_mode():
    t = Tracker()
    await run_batch(
        [t.make("s", safe=True)], [("s", {"n": i}) for i in range(3)], tool_concurrency={"mode": "sequential"}
    )
    assert t.peak == 1
    t = Tracker()
    await run_batch([t.make("u")], [("u", {"n": i}) for i in range(3)], tool_concurrency={"mode": "all"})
    assert t.peak == 3


async def test_results_come_back_in_tool_use_order_when_handlers_finish_out_of_order():
    second_done = asyncio.Event()
    finished: list[str] = []

    async def first(_):
        await second_done.wait()
        finished.append("first")
        return "one"

    async def second(_):
        finished.append("second")
        second_done.set()
        return "two"

    tools = [
        tool("first", "F", Empty, first, is_concurrency_safe=True),
        tool("second", "S", Empty, second, is_concurrency_safe=True),
    ]
    contents = await run_batch(tools, [("first", {}), ("second", {})])
    assert finished == ["second", "first"]
    assert contents == ["one", "two"]


# --------------------------------------------------------------------------- tool_batch_policy


async def test_policy_rejection_blocks_every_call_with_code_and_message():
    ran = []
    inc = tool("increment_revision", "Inc", Empty, lambda _: ran.append("inc") or "ok")
    delegate = ToolDefinition(
        name="worker",
        description="Delegate",
        input_model={"type": "object"},
        handler=lambda _: ran.append("w") or "ok",
        kind="agent_tool",
    )
    seen = []

    class Policy:
        def validate(self, ctx):
            seen.append(ctx.tool_calls)
            names = {c["name"] for c in ctx.tool_calls}
            if {"increment_revision", "worker"} <= names:
                return {
                    "allowed": False,
                    "code": "invalid_tool_batch",
                    "message": "Update first, then hand off.",
                    "conflicting_tool_call_ids": ["i1", "w1"],
                    "suggested_next_step": "Run the update alone.",
                }
            return {"allowed": True}

    client = ScriptedModelClient(
        [
            tool_turn(("increment_revision", {}, "i1"), ("worker", {"mode": "handoff"}, "w1")),
            tool_turn(("increment_revision", {}, "i2")),
            text_turn("ok"),
        ]
    )
    events = await run(
        create_bare_agent(model_client=client, tools=[inc, delegate], tool_batch_policy=Policy())
    )
    rejected, allowed = users(events)
    assert ran == ["inc"]  # only the second (allowed) batch ran
    for block in blocks_of(rejected):
        assert block["is_error"] is True
        assert json.loads(block["content"]) == {
            "error": {
                "code": "invalid_tool_batch",
                "message": "Update first, then hand off.",
                "conflicting_tool_call_ids": ["i1", "w1"],
                "suggested_next_step": "Run the update alone.",
            }
        }
    assert rejected.error == "Update first, then hand off."
    assert seen[0] == [
        {"id": "i1", "name": "increment_revision", "input": {}, "kind": "tool"},
        {"id": "w1", "name": "worker", "input": {"mode": "handoff"}, "kind": "agent_tool"},
    ]
    assert blocks_of(allowed)[0]["content"] == "ok"


async def test_raising_or_malformed_policy_uses_tool_batch_policy_error():
    ran = []
    t = tool("t", "T", Empty, lambda _: ran.append(1) or "ok")

    async def raising(_ctx):
        raise KeyError("oops")

    for policy in (raising, lambda ctx: "yes"):
        client = ScriptedModelClient([tool_turn(("t", {}), ("t", {})), text_turn("ok")])
        events = await run(create_bare_agent(model_client=client, tools=[t], tool_batch_policy=policy))
        for block in blocks_of(users(events)[0]):
            assert (
                block["is_error"]
                and json.loads(block["content"])["error"]["code"] == "tool_batch_policy_error"
            )
    assert ran == []


# --------------------------------------------------------------------------- permission


async def test_permission_deny_is_an_error_result_with_the_message_and_runs_before_parsing():
    ran = []
    requests: list[PermissionRequest] = []
    bash = tool("bash", "Shell", N, lambda i: ran.append("bash") or "ran")
    read = tool("read", "Read", N, lambda i: ran.append("read") or "read ok")

    def permission(request: PermissionRequest):
        requests.append(request)
        if request.tool_name == "bash":
            return {"behavior": "deny", "message": "Shell access is disabled for this session."}
        return {"behavior": "allow"}

    client = ScriptedModelClient(
        [tool_turn(("bash", {"n": "not-an-int"}, "b1"), ("read", {"n": 1}, "r1")), text_turn("ok")]
    )
    events = await run(create_bare_agent(model_client=client, tools=[bash, read], permission=permission))
    denied, allowed = blocks_of(users(events)[0])
    # the invalid input never got parsed: the denial wins
    assert denied == {
        "type": "tool_result",
        "tool_use_id": "b1",
        "content": "Shell access is disabled for this session.",
        "is_error": True,
    }
    assert allowed["content"] == "read ok"
    assert ran == ["read"]
    assert [(r.tool_name, r.input, r.tool_use_id) for r in requests] == [
        ("bash", {"n": "not-an-int"}, "b1"),
        ("read", {"n": 1}, "r1"),
    ]
    assert events[-1].subtype == "success"


async def test_async_permission_and_fail_closed_answers():
    t = tool("t", "T", Empty, lambda _: "ran")

    async def allow(_request):
        await asyncio.sleep(0)
        return {"behavior": "allow"}

    result = await create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("t", {})), text_turn("ok")]), tools=[t], permission=allow
    ).prompt("go")
    assert result.subtype == "success"

    def raising(_request):
        raise RuntimeError("policy server down")

    for permission, expected in (
        (raising, "policy server down"),
        (lambda r: {"behavior": "maybe"}, "not {'behavior'"),
    ):
        client = ScriptedModelClient([tool_turn(("t", {})), text_turn("ok")])
        events = await run(create_bare_agent(model_client=client, tools=[t], permission=permission))
        [block] = blocks_of(users(events)[0])
        assert block["is_error"] and expected in block["content"] and "not run" in block["content"]


async def test_aborted_batch_does_not_start_waiting_calls_and_settles_started_ones():
    controller = AbortController()
    started = []

    async def handler(inp: N, ctx: ToolContext):
        started.append(inp.n)
        if inp.n == 0:
            controller.abort("user cancelled")
            await asyncio.sleep(0)
            assert ctx.signal.aborted
            return "saw abort"
        return "ran"

    slow = tool("slow", "S", N, handler)
    client = ScriptedModelClient(
        [tool_turn(("slow", {"n": 0}, "a"), ("slow", {"n": 1}, "b")), text_turn("never")]
    )
    hooked = []
    hooks = {"on_tool_result": lambda ctx: hooked.append((ctx.tool_use_id, type(ctx.error).__name__))}
    events = await run(
        create_bare_agent(model_client=client, tools=[slow], hooks=hooks), signal=controller.signal
    )
    assert hooked == [("a", "NoneType"), ("b", "AbortError")]  # hooks see cancelled calls too
    assert [e.type for e in events] == ["system", "assistant", "user", "result"]
    user = users(events)[0]
    first, second = blocks_of(user)
    assert first == {"type": "tool_result", "tool_use_id": "a", "content": "saw abort"}
    assert second["is_error"] and "aborted" in second["content"]
    assert user.error is not None and "aborted" in user.error
    assert started == [0]
    assert events[-1].subtype == "error_abort" and "user cancelled" in events[-1].error
    assert len(client.requests) == 1


async def test_abort_signal_timeout_mid_model_call():
    never = asyncio.Event()

    async def hang(_request):
        await never.wait()

    result = await create_bare_agent(model_client=ScriptedModelClient([hang])).prompt(
        "x", signal=AbortSignal.timeout(0.05)
    )
    assert result.subtype == "error_abort" and result.error_type == "AbortError"
