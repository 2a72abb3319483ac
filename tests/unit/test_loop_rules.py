"""Loop rules with a scripted model: bounded tool results, tool input that is not an
object, the one-conversation guard across threads, the thinking budget."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import (
    DEFAULT_MAX_TOOL_RESULT_CHARS,
    AgentHooks,
    AssistantModelMessage,
    ConcurrentQueryError,
    ConfigError,
    ScriptedModelClient,
    create_bare_agent,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.agent.result_limits import bound_tool_result


class Empty(BaseModel):
    pass


class Note(BaseModel):
    text: str


def results_of(events: list[Any]) -> list[dict[str, Any]]:
    return [b for e in events if e.type == "user" for b in e.message["content"]]


async def events_of(agent: Any, prompt: str = "go") -> list[Any]:
    return [e async for e in agent.query(prompt, stream=False)]


# ------------------------------------------------------------------------ bounded results


def test_bound_tool_result_cuts_text_and_says_how_much_was_left_out():
    block = {"type": "tool_result", "tool_use_id": "t", "content": "a" * 250}
    cut = bound_tool_result(block, 100)
    assert cut["content"].startswith(
        "a" * 100 + "\n\n[... 150 of 250 characters of this tool result were left out"
    )
    assert "max_tool_result_chars" in cut["content"] and block["content"] == "a" * 250
    assert bound_tool_result(block, 250) is block and bound_tool_result(block, None) is block

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 500}}
    listed = {
        "type": "tool_result",
        "tool_use_id": "t",
        "content": [
            {"type": "text", "text": "x" * 60},
            image,
            {"type": "text", "text": "y" * 60},
            {"type": "text", "text": "z"},
        ],
        "is_error": True,
    }
    cut = bound_tool_result(listed, 100)
    assert cut["is_error"] is True
    assert cut["content"][:3] == [
        {"type": "text", "text": "x" * 60},
        image,
        {"type": "text", "text": "y" * 40},
    ]
    assert cut["content"][3]["text"].startswith("[... 21 of 121 characters")
    assert len(cut["content"]) == 4


async def test_a_huge_tool_result_reaches_the_model_cut_with_a_note():
    huge = "line of output\n" * 400_000  # 6 MB
    dump = tool("dump", "Dump everything", Empty, lambda _: huge)
    client = ScriptedModelClient([tool_turn(("dump", {}, "d1")), text_turn("ok")])
    events = await events_of(create_bare_agent(model_client=client, tools=[dump]))
    [block] = results_of(events)
    sent = client.requests[1].messages[-1]["content"][0]["content"]
    assert block["content"] == sent
    assert sent.startswith(huge[:DEFAULT_MAX_TOOL_RESULT_CHARS])
    left = len(huge) - DEFAULT_MAX_TOOL_RESULT_CHARS
    assert f"[... {left:,} of {len(huge):,} characters of this tool result were left out" in sent
    assert len(sent) < DEFAULT_MAX_TOOL_RESULT_CHARS + 300


async def test_the_bound_is_configurable_applies_after_hooks_and_can_be_off():
    long = tool("long", "Long", Empty, lambda _: "b" * 50)

    def grow(ctx: Any) -> dict[str, Any]:
        return {**ctx.result, "content": ctx.result["content"] + "c" * 50}

    client = ScriptedModelClient([tool_turn(("long", {})), text_turn("ok")])
    agent = create_bare_agent(
        model_client=client, tools=[long], max_tool_result_chars=60, hooks=AgentHooks(on_tool_result=grow)
    )
    [block] = results_of(await events_of(agent))
    assert block["content"].startswith("b" * 50 + "c" * 10 + "\n\n[... 40 of 100 characters")

    client = ScriptedModelClient([tool_turn(("long", {})), text_turn("ok")])
    agent = create_bare_agent(model_client=client, tools=[long], max_tool_result_chars=None)
    [block] = results_of(await events_of(agent))
    assert block["content"] == "b" * 50


@pytest.mark.parametrize("bad", [0, -5, "100", 1.5, True])
def test_max_tool_result_chars_is_validated(bad):
    with pytest.raises(ConfigError, match="max_tool_result_chars"):
        create_bare_agent(max_tool_result_chars=bad)


# ------------------------------------------------------------------ input that is not an object


async def test_tool_input_that_is_not_valid_json_is_an_error_result_the_model_can_fix():
    ran: list[str] = []
    note = tool("note", "Take a note", Note, lambda i: ran.append(i.text) or "noted")
    client = ScriptedModelClient(
        [
            AssistantModelMessage(
                content=[
                    {"type": "tool_use", "id": "bad", "name": "note", "input": '{"text": "unterminated'},
                    {"type": "tool_use", "id": "enc", "name": "note", "input": '{"text": "encoded"}'},
                ],
                stop_reason="tool_use",
            ),
            tool_turn(("note", {"text": "fixed"}, "good")),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(model_client=client, tools=[note])
    events = await events_of(agent)
    assert events[-1].subtype == "success" and events[-1].result == "done"
    bad, encoded, good = results_of(events)
    assert bad["is_error"] is True and bad["tool_use_id"] == "bad"
    assert 'tool "note" was not run: the input is not valid JSON' in bad["content"]
    assert '{"text": "unterminated' in bad["content"] and "Reissue the call" in bad["content"]
    assert encoded == {"type": "tool_result", "tool_use_id": "enc", "content": "noted"}
    assert good["content"] == "noted" and ran == ["encoded", "fixed"]
    # the stored (and re-sent) tool_use blocks carry objects
    first_turn = (await agent.get_history())[1]["content"]
    assert [b["input"] for b in first_turn] == [{}, {"text": "encoded"}]
    assert client.requests[1].messages[1]["content"] == first_turn


async def test_a_permission_callback_never_sees_an_input_that_was_not_json():
    asked: list[Any] = []
    note = tool("note", "Take a note", Note, lambda i: "noted")
    client = ScriptedModelClient(
        [
            AssistantModelMessage(
                content=[{"type": "tool_use", "id": "bad", "name": "note", "input": "{oops"}],
                stop_reason="tool_use",
            ),
            text_turn("done"),
        ]
    )
    agent = create_bare_agent(
        model_client=client, tools=[note], permission=lambda r: asked.append(r.input) or {"behavior": "allow"}
    )
    [block] = results_of(await events_of(agent))
    assert block["is_error"] and asked == []


# ------------------------------------------------------------------------------- the guard


def test_two_threads_with_their_own_loops_never_both_run_one_agent():
    """Each round, two threads (each running its own event loop) start a query on the
    same Agent at the same instant: exactly one runs, the other gets ConcurrentQueryError.
    The winner's model call waits until the other was refused, so the two queries always
    overlap (a broken guard lets both into the model call: neither is refused)."""
    state: dict[str, Any] = {}

    async def held(_: Any) -> AssistantModelMessage:
        await asyncio.to_thread(state["refused"].wait, 5)
        return AssistantModelMessage(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")

    agent = create_bare_agent(model_client=ScriptedModelClient(held))

    def contender(barrier: threading.Barrier, outcomes: list[str]) -> None:
        async def go() -> str:
            barrier.wait()
            try:
                result = await agent.prompt("hi", stream=False)
            except ConcurrentQueryError:
                state["refused"].set()
                return "refused"
            return result.subtype

        outcomes.append(asyncio.run(go()))

    rounds = 200
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: widen any race window
    try:
        for round_no in range(rounds):
            state["refused"] = threading.Event()
            barrier = threading.Barrier(2)
            outcomes: list[str] = []
            threads = [threading.Thread(target=contender, args=(barrier, outcomes)) for _ in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(15)
            assert sorted(outcomes) == ["refused", "success"], f"round {round_no}: {outcomes}"
            assert not agent.running
    finally:
        sys.setswitchinterval(interval)
    # every winning query was one whole turn: two messages per round, never interleaved
    history = asyncio.run(agent.get_history())
    assert [m["role"] for m in history] == ["user", "assistant"] * rounds


async def test_replace_history_is_refused_while_another_thread_runs_a_query():
    started = threading.Event()
    release = threading.Event()

    async def held(_: Any) -> AssistantModelMessage:
        started.set()
        await asyncio.to_thread(release.wait, 10)
        return AssistantModelMessage(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")

    agent = create_bare_agent(model_client=ScriptedModelClient(held))
    worker = threading.Thread(target=lambda: asyncio.run(agent.prompt("hi", stream=False)))
    worker.start()
    try:
        assert await asyncio.to_thread(started.wait, 10)
        assert agent.running
        with pytest.raises(ConcurrentQueryError):
            await agent.replace_history([])
        with pytest.raises(ConcurrentQueryError):
            await agent.prompt("me too")
    finally:
        release.set()
        await asyncio.to_thread(worker.join, 10)
    assert not agent.running and [m["role"] for m in await agent.get_history()] == ["user", "assistant"]


# ------------------------------------------------------------------------- thinking budget


async def test_a_thinking_budget_is_capped_at_max_tokens_minus_one():
    client = ScriptedModelClient([text_turn("a"), text_turn("b")])
    agent = create_bare_agent(
        model_client=client, max_tokens=3000, thinking_config={"type": "enabled", "budget_tokens": 8000}
    )
    await agent.prompt("x")
    assert client.requests[0].thinking == {"type": "enabled", "budget_tokens": 2999}
    await agent.prompt("y", thinking_config={"type": "enabled", "budget_tokens": 1024})
    assert client.requests[1].thinking == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize(
    ("options", "match"),
    [
        (
            {"thinking_config": {"type": "enabled", "budget_tokens": 1023}},
            "below the provider's minimum of 1024",
        ),
        (
            {"max_tokens": 1024, "thinking_config": {"type": "enabled", "budget_tokens": 4000}},
            "capped at max_tokens - 1 = 1023 is below the provider's minimum of 1024",
        ),
    ],
)
def test_a_thinking_budget_below_the_provider_minimum_is_a_config_error(options, match):
    with pytest.raises(ConfigError, match=match):
        create_bare_agent(**options)


async def test_a_query_thinking_budget_that_the_cap_pushes_below_the_minimum_is_refused():
    client = ScriptedModelClient([text_turn("never")])
    agent = create_bare_agent(model_client=client, max_tokens=1000)
    with pytest.raises(ConfigError, match="capped at max_tokens - 1 = 999"):
        await agent.prompt("x", thinking_config={"type": "enabled", "budget_tokens": 2000})
    assert client.requests == [] and not agent.running
    with pytest.raises(ConfigError, match="minimum"):
        await agent.prompt("x", thinking_config={"type": "enabled", "budget_tokens": 100})
