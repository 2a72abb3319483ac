"""Bad input at the agent loop's public entry points gets a clear error and loses
nothing (the agent loop, tools, hooks, errors). Every case checks the history
afterwards: it stays well-formed (each
``tool_use`` answered by one ``tool_result``) and holds nothing of the bad input.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import (
    AbortController,
    AbortSignal,
    APIError,
    AssistantModelMessage,
    ConcurrentQueryError,
    ConfigError,
    ScriptedModelClient,
    ToolResult,
    create_agent,
    create_bare_agent,
    define_agent,
    define_history_store,
    text_turn,
    tool,
    tool_turn,
)


class Empty(BaseModel):
    pass


async def run(agent, prompt="go", **options):
    return [e async for e in agent.query(prompt, stream=False, **options)]


def reply(*blocks: Any, **fields: Any) -> AssistantModelMessage:
    return AssistantModelMessage(content=list(blocks), **fields)


def assert_well_formed(history: list[dict]) -> None:
    """Every assistant tool_use is answered, in order, by the next user message."""
    for i, message in enumerate(history):
        assert message["role"] in ("user", "assistant")
        if message["role"] != "assistant":
            continue
        ids = [b["id"] for b in message["content"] if b.get("type") == "tool_use"]
        if ids:
            answer = history[i + 1]["content"]
            assert [b["tool_use_id"] for b in answer if b.get("type") == "tool_result"] == ids


# --------------------------------------------------------------------------- malformed model replies

TEXT_OK = {"type": "text", "text": "fine"}


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (
            reply({"type": "tool_use", "name": "t", "input": {}}),
            'tool_use block without a non-empty string "id"',
        ),
        (
            reply({"type": "tool_use", "id": "a", "name": ["t"], "input": {}}),
            'tool_use block without a string "name"',
        ),
        (
            reply({"type": "tool_use", "id": "a", "name": 5, "input": {}}),
            'tool_use block without a string "name"',
        ),
        (
            reply(
                {"type": "tool_use", "id": "a", "name": "t", "input": {}},
                {"type": "tool_use", "id": "a", "name": "t", "input": {}},
            ),
            "repeats the tool_use id 'a'",
        ),
        (reply({"text": "no type"}), 'content[0] is not a content block (a dict with a string "type")'),
        (reply("plain string"), "content[0] is not a content block"),
        (AssistantModelMessage(content="hello"), "content is str, not a list of content blocks"),  # type: ignore[arg-type]
        (reply({"type": "text", "text": 5}), 'text block without a string "text"'),
        (reply(TEXT_OK, usage="lots"), "usage is str, not a dict or TokenUsage"),
        (reply(TEXT_OK, stop_reason=5), "stop_reason is int, not a string"),
        (reply(TEXT_OK, model=["m"]), "model is list, not a string"),
    ],
)
async def test_a_malformed_model_reply_ends_error_and_stores_nothing(bad, problem):
    ran = []
    t = tool("t", "T", Empty, lambda _: ran.append(1) or "ok")
    client = ScriptedModelClient([bad, text_turn("recovered")])
    agent = create_bare_agent(model_client=client, tools=[t])
    events = await run(agent)
    assert [e.type for e in events] == ["system", "result"]  # no assistant event for a reply we reject
    result = events[-1]
    assert result.subtype == "error" and result.is_error is True and result.error_type == "APIError"
    assert isinstance(result.exception, APIError)
    assert "malformed reply" in result.error and problem in result.error
    assert ran == []
    assert await agent.get_history() == [{"role": "user", "content": "go"}]
    # the Agent is usable again and the next request carries no trace of the bad reply
    # (the two user turns go as one message: consecutive same-role messages are merged)
    assert (await agent.prompt("again")).result == "recovered"
    assert client.requests[1].messages == [
        {"role": "user", "content": [{"type": "text", "text": "go"}, {"type": "text", "text": "again"}]},
    ]


async def test_a_reply_with_only_thinking_is_kept_and_sent_back():
    thinking = {"type": "thinking", "thinking": "hmm", "signature": "sig-1"}
    client = ScriptedModelClient([reply(thinking, stop_reason="end_turn"), text_turn("second")])
    agent = create_bare_agent(model_client=client)
    result = await agent.prompt("x")
    assert (result.subtype, result.is_error, result.result) == ("success", False, "")
    assert await agent.get_history() == [
        {"role": "user", "content": "x"},
        {"role": "assistant", "content": [thinking]},
    ]
    await agent.prompt("y")
    assert client.requests[1].messages[1] == {"role": "assistant", "content": [thinking]}


# --------------------------------------------------------------------------- odd handler return values


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        (None, 'tool "t" returned NoneType'),
        (5, 'tool "t" returned int'),
        (b"bytes", 'tool "t" returned bytes'),
        ({"text": "x"}, 'a result dict needs "content"'),
        ({"content": 5}, "ToolResult.content of type int"),
        (["a", "b"], "item 0 is not a content block"),
        ({"content": "done", "end_turn": "false"}, "end_turn must be True or False"),
        ({"content": "done", "is_error": "no"}, "is_error must be True or False"),
        (ToolResult("done", end_turn=1), "end_turn must be True or False"),  # type: ignore[arg-type]
    ],
)
async def test_an_odd_handler_return_value_is_an_error_result_and_the_loop_continues(returned, message):
    odd = tool("t", "T", Empty, lambda _: returned)
    client = ScriptedModelClient([tool_turn(("t", {}, "c1")), text_turn("carried on")])
    agent = create_bare_agent(model_client=client, tools=[odd])
    events = await run(agent)
    [user] = [e for e in events if e.type == "user"]
    [block] = user.message["content"]
    assert block["tool_use_id"] == "c1" and block["is_error"] is True and message in block["content"]
    assert message in user.error
    result = events[-1]
    assert (result.subtype, result.result) == ("success", "carried on")  # a bad end_turn never ends the run
    assert len(client.requests) == 2
    history = await agent.get_history()
    assert_well_formed(history)
    assert history[2] == user.message


async def test_a_handler_raising_cancelled_error_on_its_own_is_an_error_result():
    # e.g. the handler awaited a future someone else cancelled; the query itself was not cancelled
    async def awaits_a_cancelled_future(_):
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future

    flaky = tool("flaky", "F", Empty, awaits_a_cancelled_future)
    ok = tool("ok", "O", Empty, lambda _: "fine", is_concurrency_safe=True)
    client = ScriptedModelClient([tool_turn(("flaky", {}, "f1"), ("ok", {}, "o1")), text_turn("went on")])
    agent = create_bare_agent(model_client=client, tools=[flaky, ok])
    events = await run(agent)
    [user] = [e for e in events if e.type == "user"]
    failed, fine = user.message["content"]
    assert (
        failed["tool_use_id"] == "f1" and failed["is_error"] is True and "CancelledError" in failed["content"]
    )
    assert fine == {"type": "tool_result", "tool_use_id": "o1", "content": "fine"}
    assert events[-1].subtype == "success" and events[-1].result == "went on"
    assert_well_formed(await agent.get_history())


async def test_cancelling_the_query_task_during_a_handler_still_cancels_it_and_answers_every_call():
    started = asyncio.Event()

    async def slow(_):
        started.set()
        await asyncio.Event().wait()

    agent = create_bare_agent(
        model_client=ScriptedModelClient([tool_turn(("slow", {}, "s1"), ("slow", {}, "s2")), text_turn("x")]),
        tools=[tool("slow", "S", Empty, slow)],
    )
    task = asyncio.create_task(agent.prompt("go"))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert agent.running is False
    history = await agent.get_history()
    assert_well_formed(history)
    assert [b["is_error"] for b in history[-1]["content"]] == [True, True]  # withheld, never left dangling


# --------------------------------------------------------------------------- hooks returning bad shapes


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ("nope", "must return None or a tool_result block dict"),
        ({"type": "text", "text": "x"}, "must return None or a tool_result block dict"),
        ({"type": "tool_result", "content": 5}, "content must be a str or a list of content blocks"),
        ({"type": "tool_result", "content": ["x"]}, "content must be a str or a list of content blocks"),
        ({"type": "tool_result", "content": "ok", "is_error": "yes"}, "is_error must be True or False"),
        ({"type": "tool_result", "tool_use_id": "other", "content": "x"}, "cannot add, drop or re-route"),
    ],
)
async def test_an_on_tool_result_hook_returning_a_bad_block_raises_config_error(returned, message):
    t = tool("t", "T", Empty, lambda _: "raw")
    client = ScriptedModelClient([tool_turn(("t", {}, "c1")), text_turn("next")])
    agent = create_bare_agent(model_client=client, tools=[t], hooks={"on_tool_result": lambda ctx: returned})
    with pytest.raises(ConfigError, match=message):
        await agent.prompt("go")
    assert agent.running is False
    history = await agent.get_history()
    assert_well_formed(history)
    [withheld] = history[-1]["content"]  # never the hook's bad block, never the unhooked content
    assert withheld["is_error"] is True and "withheld" in withheld["content"]


async def test_an_on_tool_result_hook_may_drop_content_and_keeps_a_valid_block():
    t = tool("t", "T", Empty, lambda _: "raw")
    client = ScriptedModelClient([tool_turn(("t", {}, "c1")), text_turn("next")])
    hooks = {"on_tool_result": lambda ctx: {"type": "tool_result", "is_error": False}}
    events = await run(create_bare_agent(model_client=client, tools=[t], hooks=hooks))
    [user] = [e for e in events if e.type == "user"]
    assert user.message["content"] == [{"type": "tool_result", "is_error": False, "tool_use_id": "c1"}]


@pytest.mark.parametrize(
    ("returned", "message"),
    [
        ([], "must return None or a dict"),
        ({"model": "x"}, "unknown keys"),
        ({"messages": "x"}, "messages must be a list of message dicts"),
        ({"system_prompt": 5}, "system_prompt must be a str or None"),
    ],
)
async def test_an_on_model_request_hook_returning_a_bad_shape_raises_config_error(returned, message):
    client = ScriptedModelClient([text_turn("never")])
    agent = create_bare_agent(model_client=client, hooks={"on_model_request": lambda ctx: returned})
    with pytest.raises(ConfigError, match=message):
        await agent.prompt("go")
    assert client.requests == [] and agent.running is False
    assert await agent.get_history() == [{"role": "user", "content": "go"}]


# --------------------------------------------------------------------------- replace_history


@pytest.mark.parametrize(
    "bad",
    [
        None,
        "abc",
        {"role": "user", "content": "x"},
        ({"role": "user", "content": "x"},),
        [1],
        [{"content": "x"}],
        [{"role": "user"}],
        [{"role": "system", "content": "x"}],
        [{"role": "user", "content": 5}],
        [{"role": "user", "content": [{"text": "no type"}]}],
    ],
)
async def test_replace_history_with_bad_messages_raises_and_keeps_the_history(bad):
    replaced = []
    store = define_history_store(load=lambda: [], append=lambda m: None, replace=replaced.append)
    agent = create_bare_agent(model_client=ScriptedModelClient([text_turn("a")]), history_store=store)
    await agent.prompt("keep me")
    before = await agent.get_history()
    with pytest.raises(ConfigError, match="replace_history"):
        await agent.replace_history(bad)
    assert await agent.get_history() == before
    assert replaced == []  # the store was not touched either


async def test_replace_history_is_idle_only():
    gate = asyncio.Event()
    called = asyncio.Event()

    async def slow(_request):
        called.set()
        await gate.wait()
        return AssistantModelMessage(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")

    agent = create_bare_agent(model_client=ScriptedModelClient([slow]))
    pending = asyncio.create_task(agent.prompt("running"))
    await called.wait()
    with pytest.raises(ConcurrentQueryError, match="idle-only"):
        await agent.replace_history([{"role": "user", "content": "hijack"}])
    gate.set()
    assert (await pending).result == "done"
    assert await agent.get_history() == [
        {"role": "user", "content": "running"},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]


async def test_get_history_is_a_deep_copy():
    agent = create_bare_agent(model_client=ScriptedModelClient([text_turn("a")]))
    await agent.prompt("original")
    copy_ = await agent.get_history()
    copy_[1]["content"][0]["text"] = "edited"
    copy_.append({"role": "user", "content": "extra"})
    assert await agent.get_history() == [
        {"role": "user", "content": "original"},
        {"role": "assistant", "content": [{"type": "text", "text": "a"}]},
    ]
    # and replace_history keeps its own copy too
    mine = [{"role": "user", "content": [{"type": "text", "text": "mine"}]}]
    await agent.replace_history(mine)
    mine[0]["content"][0]["text"] = "changed later"
    assert (await agent.get_history())[0]["content"][0]["text"] == "mine"


# --------------------------------------------------------------------------- AbortSignal.timeout


@pytest.mark.parametrize("bad", [-1, -0.5, float("nan"), float("inf"), 1e300, 10**400, "1", None, True, [1]])
def test_abort_signal_timeout_rejects_bad_seconds_at_once(bad):
    threads_before = threading.active_count()
    with pytest.raises(ValueError, match="AbortSignal.timeout: seconds must be"):
        AbortSignal.timeout(bad)
    assert threading.active_count() == threads_before  # no timer thread left to crash later


async def test_abort_signal_timeout_of_zero_aborts_at_once_with_a_timeout_reason():
    signal = AbortSignal.timeout(0)
    reason = await asyncio.wait_for(signal.wait(), 5)
    assert signal.aborted and isinstance(reason, TimeoutError)


# --------------------------------------------------------------------------- options of the wrong type

WRONG_AGENT_OPTIONS = {
    "api_key": 3,
    "base_url": ["http://x"],
    "name": 3,
    "model": 3,
    "system_prompt": ["a"],
    "max_tokens": "10",
    "max_turns": 2.0,
    "thinking_config": "adaptive",
    "reasoning_effort": "medium",
    "request_timeout_ms": 1.5,
    "output_schema": dict,
    "tools": "calc",
    "tool_batch_policy": 3,
    "hooks": "x",
    "auto_compact": "yes",
    "tool_concurrency": {"modes": "all"},
    "skills": "abc",
    "workspace": True,
    "permission": {"behavior": "allow"},
    "model_client": "x",
    "tracer": print,
    "history_store": "x",
}


@pytest.mark.parametrize("factory", [create_agent, define_agent])
@pytest.mark.parametrize(("option", "value"), sorted(WRONG_AGENT_OPTIONS.items()))
def test_an_agent_option_of_the_wrong_type_is_a_config_error_naming_it(factory, option, value):
    with pytest.raises(ConfigError, match=f'{factory.__name__}: option "{option}" expects'):
        factory(**{option: value})


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("request_timeout_ms", 0),
        ("request_timeout_ms", -1),
        ("request_timeout_ms", 1.5),
        ("request_timeout_ms", True),
        ("request_timeout_ms", "100"),
        ("stream", "yes"),
        ("signal", AbortController()),
        ("tracer", print),
        ("output_format", "xml"),
        ("thinking_config", {"type": "enabled", "budget_tokens": 0}),
        ("reasoning_effort", "medium"),
        ("trace_context", "x"),
    ],
)
async def test_a_query_option_of_the_wrong_type_is_a_config_error_and_nothing_is_sent(option, value):
    client = ScriptedModelClient([text_turn("never")])
    agent = create_bare_agent(model_client=client)
    with pytest.raises(ConfigError, match=f'prompt: option "{option}" expects'):
        await agent.prompt("x", **{option: value})
    with pytest.raises(ConfigError, match=f'prompt_sync: option "{option}" expects'):
        await asyncio.to_thread(agent.prompt_sync, "x", **{option: value})
    assert client.requests == [] and await agent.get_history() == []
