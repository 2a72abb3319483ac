"""ScriptedModelClient and its turn helpers (docs/testing.md)."""

from __future__ import annotations

import json

import pytest

from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    ScriptExhaustedError,
    create_bare_agent,
    error_turn,
    text_turn,
    tool_turn,
)
from lattice_worker.errors import APIError


def request(**overrides) -> ModelRequest:
    fields = {"model": "m", "system": None, "messages": [{"role": "user", "content": "hi"}], "stream": False}
    fields.update(overrides)
    return ModelRequest(**fields)


async def test_list_items_play_in_order_and_requests_are_recorded():
    async def dynamic(req: ModelRequest) -> AssistantModelMessage:
        return AssistantModelMessage(content=[{"type": "text", "text": f"saw {len(req.messages)}"}])

    client = ScriptedModelClient([text_turn("one"), dynamic, APIError("down", status_code=500)])
    assert client.remaining == 3
    first = await client.create_message(request())
    assert first.content == [{"type": "text", "text": "one"}] and first.stop_reason == "end_turn"
    second = await client.create_message(request(messages=[{"role": "user", "content": "a"}] * 3))
    assert second.content[0]["text"] == "saw 3"
    with pytest.raises(APIError, match="down"):
        await client.create_message(request())
    with pytest.raises(ScriptExhaustedError, match=r"request #4.*only 3 turn"):
        await client.create_message(request())
    assert len(client.requests) == 4 and client.remaining == 0


async def test_one_callable_serves_every_request():
    client = ScriptedModelClient(lambda req: text_turn(f"echo {req.messages[-1]['content']}"))
    assert (await client.create_message(request())).content[0]["text"] == "echo hi"
    assert (await client.create_message(request(messages=[{"role": "user", "content": "x"}]))).content[0][
        "text"
    ] == "echo x"
    assert client.remaining is None


async def test_recorded_messages_are_a_snapshot():
    client = ScriptedModelClient([text_turn("a"), text_turn("b")])
    agent = create_bare_agent(model_client=client)
    await agent.prompt("first")
    await agent.prompt("second")
    assert len(client.requests[0].messages) == 1 and len(client.requests[1].messages) == 3


async def test_helpers_build_tool_calls_usage_delays_and_errors():
    turn = tool_turn(
        ("calc", {"expr": "1+1"}), ("look", {}, "fixed-id"), text="thinking aloud", usage={"input_tokens": 3}
    )
    assert turn.stop_reason == "tool_use"
    text, first, second = turn.content
    assert text == {"type": "text", "text": "thinking aloud"}
    assert (
        first["type"] == "tool_use" and first["id"].startswith("toolu_") and first["input"] == {"expr": "1+1"}
    )
    assert second["id"] == "fixed-id"
    other = tool_turn(("calc", {}))
    assert other.content[0]["id"] != first["id"]

    delayed = text_turn("late", delay=0.01)
    assert callable(delayed)
    client = ScriptedModelClient([delayed, error_turn(APIError("x"), delay=0.01)])
    assert (await client.create_message(request())).content[0]["text"] == "late"
    with pytest.raises(APIError):
        await client.create_message(request())

    thinking = text_turn("answer", thinking="hmm", thinking_signature="sig")
    assert thinking.content[0] == {"type": "thinking", "thinking": "hmm", "signature": "sig"}


async def test_stream_events_are_anthropic_shaped_and_reassemble_the_message():
    events: list[dict] = []
    turn = tool_turn(
        ("calc", {"expr": "6*7"}, "t1"), text="Let me compute.", usage={"input_tokens": 5, "output_tokens": 9}
    )
    client = ScriptedModelClient([turn])
    message = await client.create_message(request(stream=True, on_stream_event=events.append))
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0]["message"]["usage"]["input_tokens"] == 5
    assert events[1]["content_block"] == {"type": "text", "text": ""}
    assert events[4]["content_block"] == {"type": "tool_use", "id": "t1", "name": "calc", "input": {}}
    fragments = "".join(
        e["delta"]["partial_json"] for e in events if e["type"] == "content_block_delta" and e["index"] == 1
    )
    assert json.loads(fragments) == {"expr": "6*7"}
    assert events[-2]["delta"]["stop_reason"] == "tool_use" and events[-2]["usage"]["output_tokens"] == 9
    assert message.content == turn.content


def test_bad_scripts_are_rejected_at_construction():
    with pytest.raises(TypeError, match="turn 1 is str"):
        ScriptedModelClient([text_turn("ok"), "not a turn"])
    with pytest.raises(TypeError):
        ScriptedModelClient("text")
    with pytest.raises(TypeError, match=r"turn 0 is the exception class ValueError; put an instance"):
        ScriptedModelClient([ValueError])
    with pytest.raises(TypeError, match="turns must be a list"):
        ScriptedModelClient(turn for turn in [text_turn("generators are not replayable")])
    for bad in [("calc",), "calc", ("calc", {}, "id", "extra"), (5, {})]:
        with pytest.raises(TypeError, match=r"tool_turn: call 0 must be a tuple \(name, input\)"):
            tool_turn(bad)
    with pytest.raises(TypeError, match="text_turn: text must be a str"):
        text_turn(5)
