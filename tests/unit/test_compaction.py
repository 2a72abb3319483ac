"""Automatic context compaction with a scripted model: when it runs, what the history
becomes, the event, the usage, the store, overflow recovery (once per query)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import (
    DEFAULT_COMPACTION_PROMPT,
    APIError,
    AutoCompactOptions,
    ScriptedModelClient,
    create_bare_agent,
    define_context_tracer,
    define_history_store,
    error_turn,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.agent.compaction import (
    SUMMARY_PREFIX,
    choose_cut,
    context_tokens,
    is_overflow_error,
    render_transcript,
)

BIG = {"input_tokens": 150_000, "output_tokens": 10}
SMALL = {"input_tokens": 100, "output_tokens": 10}
SUMMARY_USAGE = {"input_tokens": 900, "output_tokens": 40}


class StepInput(BaseModel):
    n: int


def step_tool() -> Any:
    return tool("step", "One step of the work", StepInput, lambda i: f"step {i.n} done")


class Store:
    """An in-memory history store recording every call."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.replaced: list[list[dict[str, Any]]] = []

    def build(self) -> Any:
        return define_history_store(
            load=lambda: list(self.messages), append=self._append, replace=self._replace
        )

    def _append(self, message: dict[str, Any]) -> None:
        self.messages.append(message)

    def _replace(self, messages: list[dict[str, Any]]) -> None:
        self.replaced.append(messages)
        self.messages = list(messages)


def summary_turn(text: str = "SUMMARY: steps 1 and 2 are done; do step 3 next.") -> Any:
    return text_turn(text, usage=SUMMARY_USAGE)


def is_summary_request(request: Any) -> bool:
    last = request.messages[-1]["content"]
    return not request.tools and isinstance(last, list) and "<conversation>" in last[0]["text"]


async def events_of(agent: Any, prompt: Any = "go", **options: Any) -> list[Any]:
    return [e async for e in agent.query(prompt, stream=False, **options)]


def compactions(events: list[Any]) -> list[Any]:
    return [e for e in events if e.type == "system" and e.subtype == "compaction"]


# ------------------------------------------------------------------------------ pieces


def test_choose_cut_keeps_the_last_messages_and_never_strands_a_tool_result():
    h = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "s", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "b", "name": "s", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b", "content": "2"}]},
    ]
    assert choose_cut(h, 2) == 3  # kept: the tool_use b and its result
    assert choose_cut(h, 1) == 3  # keeping only b's result would strand it: keep its tool_use too
    assert choose_cut(h, 3) == 1  # kept part starts with a's tool_use
    assert choose_cut(h, 0) == 5  # everything summarised (nothing kept refers to anything)
    assert choose_cut(h, 4) == 1
    assert choose_cut(h, 5) is None  # nothing left to summarise
    assert choose_cut(h, 9) is None
    only_result = [h[2]]  # a tool_result whose tool_use is already gone: no cut can keep it whole
    assert choose_cut(only_result, 0) == 1 and choose_cut(only_result, 1) is None


def test_choose_cut_moves_earlier_until_the_kept_part_stands_on_its_own():
    h = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "s", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a", "content": "1"}]},
    ]
    assert choose_cut(h, 1) == 1  # only the prompt is summarised
    assert choose_cut(h, 2) == 1


def test_render_transcript_shows_text_tools_and_results_but_not_thinking():
    text = render_transcript(
        [
            {"role": "user", "content": "please add"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "secret plan", "signature": "s"},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2", "is_error": True}],
            },
            {
                "role": "user",
                "content": [{"type": "image", "source": {}}, {"type": "text", "text": "x" * 30_000}],
            },
        ]
    )
    assert "[user]\nplease add" in text
    assert '[tool call add (id t1)] {"a": 1}' in text
    assert "[tool error for t1] 2" in text
    assert "secret plan" not in text
    assert "[image block]" in text
    assert "10,000 more characters left out" in text


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (
            APIError(
                "provider error 400 invalid_request_error: prompt is too long: 208656 tokens > 200000 maximum",
                status_code=400,
            ),
            True,
        ),
        (
            APIError(
                "x",
                status_code=400,
                body={
                    "error": {
                        "type": "invalid_request_error",
                        "message": "prompt is too long: 5 tokens > 4 maximum",
                    }
                },
            ),
            True,
        ),
        (APIError("This model's maximum context length is 131072 tokens", status_code=400), True),
        (
            APIError(
                "input length and `max_tokens` exceed context limit: 199000 + 4096 > 200000", status_code=400
            ),
            True,
        ),
        (APIError("provider error 529 overloaded_error: prompt is too long", status_code=529), False),
        (
            APIError(
                "provider error 400 invalid_request_error: max_tokens: must be positive", status_code=400
            ),
            False,
        ),
        (RuntimeError("prompt is too long"), False),
    ],
)
def test_is_overflow_error(exc, expected):
    assert is_overflow_error(exc) is expected


def test_context_tokens_counts_cached_input_too():
    assert context_tokens(None) is None
    assert (
        context_tokens({"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 1})
        == 16
    )


# ------------------------------------------------------------------------------ the loop


async def test_compaction_past_the_threshold_rewrites_history_and_the_run_completes():
    store = Store()
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}, "t1"), usage=SMALL),
            tool_turn(("step", {"n": 2}, "t2"), usage=BIG),  # past the threshold
            summary_turn(),
            tool_turn(("step", {"n": 3}, "t3"), usage=SMALL),
            text_turn("all done", usage=SMALL),
        ]
    )
    agent = create_bare_agent(
        model="main-model",
        model_client=client,
        tools=[step_tool()],
        history_store=store.build(),
        auto_compact=AutoCompactOptions(threshold_tokens=100_000, keep_recent_messages=2),
    )
    events = await events_of(agent)
    result = events[-1]
    assert result.subtype == "success" and result.result == "all done"

    # one compaction, between turn 2's tool results and turn 3's request
    [event] = compactions(events)
    order = [(e.type, getattr(e, "subtype", None)) for e in events]
    assert order[:6] == [
        ("system", "init"),
        ("assistant", None),
        ("user", None),
        ("assistant", None),
        ("user", None),
        ("system", "compaction"),
    ]
    assert event.trigger == "threshold"
    assert event.compacted_messages == 3 and event.retained_messages == 2
    assert event.usage == {**SUMMARY_USAGE, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}

    # the summary request: the older messages as a transcript, then the default instruction; no tools
    summary_request = client.requests[2]
    assert is_summary_request(summary_request) and summary_request.model == "main-model"
    text = summary_request.messages[0]["content"][0]["text"]
    assert text.endswith(DEFAULT_COMPACTION_PROMPT)
    assert "[user]\ngo" in text and "[tool call step (id t1)]" in text and "step 1 done" in text
    assert "t2" not in text  # the kept messages are not summarised

    # the next turn starts from the summary followed by the kept messages
    summary_message = {
        "role": "user",
        "content": [
            {"type": "text", "text": SUMMARY_PREFIX + "SUMMARY: steps 1 and 2 are done; do step 3 next."}
        ],
    }
    assert client.requests[3].messages == [
        summary_message,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t2", "name": "step", "input": {"n": 2}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "step 2 done"}]},
    ]
    # the stored history was replaced once, with exactly that; then appended to
    assert store.replaced == [client.requests[3].messages]
    history = await agent.get_history()
    assert history[:3] == client.requests[3].messages and store.messages == history
    assert [m["role"] for m in history] == ["user", "assistant", "user", "assistant", "user", "assistant"]

    # the summary's tokens are part of the query's usage
    assert result.usage["input_tokens"] == 100 + 150_000 + 900 + 100 + 100
    assert result.usage["output_tokens"] == 10 * 4 + 40
    assert result.num_turns == 4  # the summary request is not a turn


async def test_a_compaction_is_a_tracer_event_between_the_turns():
    traced: list[dict[str, Any]] = []
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}, "t1"), usage=SMALL),
            tool_turn(("step", {"n": 2}, "t2"), usage=BIG),
            summary_turn("SUMMARY: two steps done."),
            text_turn("all done", usage=SMALL),
        ]
    )
    agent = create_bare_agent(
        model="main-model",
        model_client=client,
        tools=[step_tool()],
        tracer=define_context_tracer(on_event=traced.append),
        auto_compact=AutoCompactOptions(threshold_tokens=100_000, keep_recent_messages=2),
    )
    events = await events_of(agent)
    assert events[-1].result == "all done"
    types = [e["type"] for e in traced]
    assert types.count("compaction") == 1
    at = types.index("compaction")
    assert types[at - 2 : at] == ["tool_result", "user_message"]  # after turn 2's tool results
    assert types[at + 1] == "model_request"  # before turn 3
    data = traced[at]["data"]
    assert (data["trigger"], data["model"], data["compacted_messages"], data["retained_messages"]) == (
        "threshold",
        "main-model",
        3,
        2,
    )
    assert data["summary"] == "SUMMARY: two steps done."
    assert data["usage"]["input_tokens"] == SUMMARY_USAGE["input_tokens"]
    assert traced[at]["session_id"] == traced[0]["session_id"]


async def test_prompt_model_and_max_tokens_of_the_options_are_used():
    client = ScriptedModelClient(
        [tool_turn(("step", {"n": 1}), usage=BIG), summary_turn("S"), text_turn("ok")]
    )
    agent = create_bare_agent(
        model="main",
        max_tokens=2048,
        model_client=client,
        tools=[step_tool()],
        auto_compact={
            "threshold_tokens": 1000,
            "keep_recent_messages": 2,
            "prompt": "Summarise tersely.",
            "model": "cheap",
            "max_tokens": 512,
        },
    )
    await agent.prompt("go", stream=False)
    request = client.requests[1]
    assert request.model == "cheap" and request.max_tokens == 512 and request.thinking is None
    assert request.messages[0]["content"][0]["text"].endswith("</conversation>\n\nSummarise tersely.")
    assert client.requests[2].max_tokens == 2048 and client.requests[2].model == "main"


async def test_auto_compact_true_uses_the_defaults():
    client = ScriptedModelClient(
        [tool_turn(("step", {"n": 1}), usage={"input_tokens": 100_000}), text_turn("ok")]
    )
    agent = create_bare_agent(model_client=client, tools=[step_tool()], auto_compact=True)
    assert agent.options.compaction == AutoCompactOptions()
    events = await events_of(agent)
    # 100,000 is not *more* than the 100,000 default: no compaction (and the history is too short anyway)
    assert compactions(events) == [] and len(client.requests) == 2


async def test_no_safe_cut_skips_compaction():
    client = ScriptedModelClient([tool_turn(("step", {"n": 1}), usage=BIG), text_turn("ok")])
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 10, "keep_recent_messages": 6},
    )
    events = await events_of(agent)
    assert compactions(events) == [] and events[-1].result == "ok"
    assert not any(is_summary_request(r) for r in client.requests)


async def test_a_client_that_reports_no_usage_never_compacts():
    client = ScriptedModelClient([tool_turn(("step", {"n": i})) for i in range(4)] + [text_turn("ok")])
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1, "keep_recent_messages": 0},
    )
    events = await events_of(agent)
    assert compactions(events) == [] and len(client.requests) == 5


async def test_off_by_default():
    client = ScriptedModelClient(
        [tool_turn(("step", {"n": 1}), usage=BIG), tool_turn(("step", {"n": 2}), usage=BIG), text_turn("ok")]
    )
    agent = create_bare_agent(model_client=client, tools=[step_tool()])
    events = await events_of(agent)
    assert compactions(events) == [] and len(client.requests) == 3


async def test_max_tokens_never_triggers_compaction():
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}), usage=SMALL),
            text_turn("a truncated answ", usage=SMALL, stop_reason="max_tokens"),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1000, "keep_recent_messages": 0},
    )
    result = (await events_of(agent))[-1]
    assert result.subtype == "success" and result.stop_reason == "max_tokens"
    assert len(client.requests) == 2  # no summary request, no retry


async def test_the_next_query_compacts_first_when_the_last_response_was_past_the_threshold():
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}), usage=SMALL),
            text_turn("first answer", usage=BIG),
            summary_turn("S1"),
            text_turn("second answer", usage=SMALL),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1000, "keep_recent_messages": 1},
    )
    assert compactions(await events_of(agent)) == []  # it ended on that response: no next turn
    events = await events_of(agent, "and now?")
    [event] = compactions(events)
    assert events[0].subtype == "init" and events[1] is event and event.compacted_messages == 4
    assert client.requests[3].messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_PREFIX + "S1"},
                {"type": "text", "text": "and now?"},
            ],
        }
    ]


async def test_a_failed_summary_request_leaves_the_history_and_the_run_goes_on():
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}), usage=SMALL),
            tool_turn(("step", {"n": 2}), usage=BIG),
            error_turn(APIError("provider error 529 overloaded_error: Overloaded", status_code=529)),
            text_turn("done anyway"),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1000, "keep_recent_messages": 2},
    )
    events = await events_of(agent)
    assert compactions(events) == [] and events[-1].result == "done anyway"
    assert len(client.requests[3].messages) == 5  # nothing was replaced


# ------------------------------------------------------------------------------ overflow recovery

PROMPT_TOO_LONG = (
    "provider error 400 invalid_request_error: prompt is too long: 250000 tokens > 200000 maximum"
)


async def test_an_overflow_error_compacts_once_and_retries_the_same_turn():
    overflow = APIError(PROMPT_TOO_LONG, status_code=400)
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}, "t1"), usage=SMALL),
            tool_turn(("step", {"n": 2}, "t2"), usage=SMALL),
            error_turn(overflow),
            summary_turn("S"),
            text_turn("recovered"),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        max_turns=3,
        auto_compact={"threshold_tokens": 1_000_000, "keep_recent_messages": 2},
    )
    events = await events_of(agent)
    [event] = compactions(events)
    assert event.trigger == "overflow" and event.compacted_messages == 3
    result = events[-1]
    assert result.subtype == "success" and result.result == "recovered"
    assert result.num_turns == 3  # the retried turn counts once (max_turns=3 was enough)
    failed, retried = client.requests[2], client.requests[4]
    assert is_summary_request(client.requests[3])
    assert retried.messages == [
        {"role": "user", "content": [{"type": "text", "text": SUMMARY_PREFIX + "S"}]},
        *failed.messages[3:],
    ]


async def test_a_second_overflow_in_the_same_query_ends_it_with_the_error():
    first = APIError(PROMPT_TOO_LONG, status_code=400)
    second = APIError(PROMPT_TOO_LONG.replace("250000", "240000"), status_code=400)
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}), usage=SMALL),
            tool_turn(("step", {"n": 2}), usage=SMALL),
            error_turn(first),
            summary_turn("S"),
            error_turn(second),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1_000_000, "keep_recent_messages": 2},
    )
    events = await events_of(agent)
    assert len(compactions(events)) == 1
    result = events[-1]
    assert result.subtype == "error" and result.exception is second
    assert "prompt is too long: 240000 tokens > 200000 maximum" in result.error
    assert sum(is_summary_request(r) for r in client.requests) == 1


async def test_when_compaction_cannot_help_the_original_error_surfaces_unchanged():
    overflow = APIError(PROMPT_TOO_LONG, status_code=400)
    client = ScriptedModelClient([error_turn(overflow)])  # the first request: nothing to summarise
    agent = create_bare_agent(model_client=client, auto_compact=True)
    result = (await events_of(agent))[-1]
    assert result.subtype == "error" and result.exception is overflow and result.error == PROMPT_TOO_LONG
    assert len(client.requests) == 1


async def test_a_window_exceeded_stop_reason_discards_the_reply_and_retries_after_compacting():
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}, "t1"), usage=SMALL),
            tool_turn(("step", {"n": 2}, "t2"), usage=SMALL),
            text_turn("half an answ", usage=SMALL, stop_reason="model_context_window_exceeded"),
            summary_turn("S"),
            text_turn("whole answer", usage=SMALL),
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1_000_000, "keep_recent_messages": 2},
    )
    events = await events_of(agent)
    assert [e.message["content"][0].get("text") for e in events if e.type == "assistant"][
        -1
    ] == "whole answer"
    assert not any("half an answ" in str(m) for m in await agent.get_history())
    assert events[-1].subtype == "success" and events[-1].usage["input_tokens"] == 100 * 4 + 900


async def test_a_second_window_exceeded_or_compaction_off_ends_with_a_clear_error():
    exceeded = text_turn("partial", usage=SMALL, stop_reason="model_context_window_exceeded")
    client = ScriptedModelClient(
        [
            tool_turn(("step", {"n": 1}), usage=SMALL),
            tool_turn(("step", {"n": 2}), usage=SMALL),
            exceeded,
            summary_turn("S"),
            exceeded,
        ]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1_000_000, "keep_recent_messages": 2},
    )
    result = (await events_of(agent))[-1]
    assert result.subtype == "error" and result.error_type == "APIError"
    assert result.stop_reason == "model_context_window_exceeded"
    assert "already compacted once in this query" in result.error

    plain = create_bare_agent(model_client=ScriptedModelClient([exceeded]))
    result = (await events_of(plain))[-1]
    assert result.subtype == "error" and "Set auto_compact=True" in result.error
    assert await plain.get_history() == [{"role": "user", "content": "go"}]


@pytest.mark.parametrize("how", ["interrupt", "abort"])
async def test_an_interrupt_or_abort_during_the_summary_request_ends_the_query_and_keeps_the_history(how):
    import asyncio

    from lattice_worker import AbortController

    controller = AbortController()
    started = asyncio.Event()

    async def slow_summary(request: Any) -> Any:
        started.set()
        await asyncio.sleep(30)

    client = ScriptedModelClient(
        [tool_turn(("step", {"n": 1}), usage=SMALL), tool_turn(("step", {"n": 2}), usage=BIG), slow_summary]
    )
    agent = create_bare_agent(
        model_client=client,
        tools=[step_tool()],
        auto_compact={"threshold_tokens": 1000, "keep_recent_messages": 2},
    )
    task = asyncio.create_task(agent.prompt("go", stream=False, signal=controller.signal))
    await asyncio.wait_for(started.wait(), 5)
    if how == "interrupt":
        assert agent.interrupt() is True
    else:
        controller.abort("stop")
    result = await asyncio.wait_for(task, 5)
    assert result.subtype == ("interrupted" if how == "interrupt" else "error_abort")
    assert len(client.requests) == 3  # no request after the abandoned summary
    assert len(await agent.get_history()) == 5  # nothing was replaced
