"""The agent loop's request rules and compaction through the real ``anthropic`` SDK,
against the fake Messages API server (tests/support/fake_anthropic.py): the exact JSON
the server received for each normalisation rule, tool input that is not JSON, and
compaction recovering from a "prompt is too long" 400 once per query."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import (
    DEFAULT_COMPACTION_PROMPT,
    AgentHooks,
    ScriptedModelClient,
    create_agent,
    create_bare_agent,
    create_team,
    team_member,
    text_turn,
    tool,
    tool_turn,
)
from lattice_worker.agent.compaction import SUMMARY_PREFIX
from tests.support.fake_anthropic import (
    FakeAnthropicServer,
    MessageReply,
    StreamReply,
    prompt_too_long,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)

pytestmark = pytest.mark.timeout(60)


class Note(BaseModel):
    text: str


NOTED: list[str] = []
note = tool("note", "Take a note", Note, lambda i: NOTED.append(i.text) or f"noted {i.text}")


@pytest.fixture(autouse=True)
def _forget_notes() -> None:
    NOTED.clear()


def agent_on(server: FakeAnthropicServer, **options: Any) -> Any:
    from lattice_worker import AnthropicModelClient

    client = AnthropicModelClient(api_key="test-key", base_url=server.url, max_retries=0)
    options.setdefault("tools", [note])
    return create_bare_agent(model="claude-test", model_client=client, **options)


def tool_result(tool_use_id: str, content: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_use_id, "content": content, **extra}


def note_call(tool_use_id: str, text: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_use_id, "name": "note", "input": {"text": text}}


# ------------------------------------------------------------------------------ normalisation


@pytest.mark.parametrize("stream", [False, True])
async def test_empty_and_whitespace_text_blocks_from_the_model_are_not_echoed_back(server, stream):
    server.enqueue(
        MessageReply([text_block(""), text_block(" \n "), note_call("t1", "a")], stop_reason="tool_use"),
        MessageReply([text_block("done")]),
    )
    result = await agent_on(server).prompt("go", stream=stream)
    assert result.result == "done"
    assert server.bodies[1]["messages"] == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [note_call("t1", "a")]},
        {"role": "user", "content": [tool_result("t1", "noted a")]},
    ]


async def test_text_a_hook_puts_before_the_tool_results_is_sent_after_them(server):
    def annotate(ctx: Any) -> dict[str, Any]:
        messages = ctx.messages
        last = messages[-1]
        if isinstance(last["content"], list):
            last["content"].insert(0, {"type": "text", "text": "reminder: be brief"})
        return {"messages": messages}

    server.enqueue(
        MessageReply([note_call("t1", "a"), note_call("t2", "b")], stop_reason="tool_use"),
        MessageReply([text_block("done")]),
    )
    agent = agent_on(server, hooks=AgentHooks(on_model_request=annotate))
    await agent.prompt("go", stream=False)
    assert server.bodies[1]["messages"][-1] == {
        "role": "user",
        "content": [
            tool_result("t1", "noted a"),
            tool_result("t2", "noted b"),
            text_block("reminder: be brief"),
        ],
    }
    assert (await agent.get_history())[-2]["content"][0]["type"] == "tool_result"  # history untouched


async def test_team_reports_join_the_tool_results_user_turn(server):
    member = create_agent(
        name="m",
        model_client=ScriptedModelClient(
            [tool_turn(("team_reply", {"content": "member result"})), text_turn("ok")]
        ),
    )
    from lattice_worker import AnthropicModelClient

    lead = create_agent(
        name="lead",
        model="claude-test",
        model_client=AnthropicModelClient(api_key="k", base_url=server.url, max_retries=0),
    )
    team = create_team(name="norm", lead=lead, members=[team_member(name="m", agent=member)])
    server.enqueue(
        MessageReply(
            [tool_use_block("h1", "m", {"mode": "handoff", "task": "work"})], stop_reason="tool_use"
        ),
        MessageReply([text_block("all done")]),
    )
    assert (await team.prompt("go", stream=False)).result == "all done"
    messages = server.bodies[1]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]  # one user turn after the batch
    receipt, header, entry = messages[-1]["content"]
    assert receipt["type"] == "tool_result" and receipt["tool_use_id"] == "h1"
    assert json.loads(receipt["content"])["status"] == "accepted"
    assert header["type"] == "text" and header["text"].startswith("Team handoff reports")
    assert json.loads(entry["text"])["content"] == "member result"


@pytest.mark.parametrize("stream", [False, True])
async def test_tool_input_that_is_not_an_object_is_sent_back_as_an_object(server, stream):
    server.enqueue(
        MessageReply(
            [{"type": "tool_use", "id": "t1", "name": "note", "input": ["not", "an", "object"]}],
            stop_reason="tool_use",
        ),
        MessageReply([text_block("done")]),
    )
    await agent_on(server).prompt("go", stream=stream)
    assistant, results = server.bodies[1]["messages"][1:]
    assert assistant == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "note", "input": {}}],
    }
    [block] = results["content"]
    assert block["is_error"] is True and "the input must be a JSON object, got array" in block["content"]
    assert NOTED == []


def _invalid_json_stream() -> StreamReply:
    return StreamReply(
        [
            {
                "type": "message_start",
                "message": {
                    "id": "msg_bad",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [],
                    "usage": {"input_tokens": 5, "output_tokens": 1},
                },
            },
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": note_call("t1", "x") | {"input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"text": '},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '"abc'},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
            {"type": "message_stop"},
        ]
    )


async def test_streamed_tool_input_that_is_not_valid_json_is_an_error_result_the_model_fixes(server):
    server.enqueue(
        _invalid_json_stream(),
        MessageReply([note_call("t2", "abc")], stop_reason="tool_use"),
        MessageReply([text_block("done")]),
    )
    agent = agent_on(server)
    result = await agent.prompt("go", stream=True)
    assert result.subtype == "success" and result.result == "done"
    second = server.bodies[1]["messages"]
    assert second[1] == {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "note", "input": {}}],
    }
    [error] = second[2]["content"]
    assert error["tool_use_id"] == "t1" and error["is_error"] is True
    assert 'tool "note" was not run: the input is not valid JSON' in error["content"]
    assert '{"text": "abc' in error["content"]
    assert server.bodies[2]["messages"][-1]["content"] == [tool_result("t2", "noted abc")]
    assert NOTED == ["abc"]


async def test_non_streamed_tool_input_that_is_not_valid_json_is_an_error_result(server):
    server.enqueue(
        MessageReply(
            [{"type": "tool_use", "id": "t1", "name": "note", "input": '{"text": "abc'}],
            stop_reason="tool_use",
        ),
        MessageReply([text_block("done")]),
    )
    agent = agent_on(server)
    assert (await agent.prompt("go", stream=False)).result == "done"
    [error] = server.bodies[1]["messages"][2]["content"]
    assert error["is_error"] is True and "not valid JSON" in error["content"]
    assert (await agent.get_history())[1]["content"][0]["input"] == {}


@pytest.mark.parametrize("stream", [False, True])
async def test_thinking_blocks_go_back_byte_for_byte(server, stream):
    thinking = thinking_block("Let me think…  \n  carefully.\n", "EqQBCkgIARABGAIiQL+/sig==")
    redacted = redacted_thinking_block("RW5jcnlwdGVkIHJlYXNvbmluZw==\n")
    server.enqueue(
        MessageReply([thinking, redacted, text_block("   "), note_call("t1", "a")], stop_reason="tool_use"),
        MessageReply([text_block("done")]),
    )
    await agent_on(
        server, thinking_config={"type": "enabled", "budget_tokens": 2048}, max_tokens=4096
    ).prompt("go", stream=stream)
    sent = server.bodies[1]["messages"][1]["content"]
    assert sent == [thinking, redacted, note_call("t1", "a")]
    raw = server.requests[1].raw.decode()
    assert (
        json.dumps(thinking["thinking"], ensure_ascii=False)[1:-1] in raw
        and thinking["signature"] in raw
        and redacted["data"][:-1] in raw
    )


# ------------------------------------------------------------------------------ compaction


def compacting_agent(server: FakeAnthropicServer) -> Any:
    return agent_on(server, auto_compact={"threshold_tokens": 1_000_000, "keep_recent_messages": 2})


def is_summary_body(body: dict[str, Any]) -> bool:
    content = body["messages"][-1]["content"]
    return "tools" not in body and isinstance(content, list) and "<conversation>" in content[0]["text"]


async def test_a_prompt_too_long_error_triggers_exactly_one_recovery(server):
    server.enqueue(
        MessageReply([note_call("t1", "a")], stop_reason="tool_use"),
        MessageReply([note_call("t2", "b")], stop_reason="tool_use"),
        prompt_too_long(),
        MessageReply(
            [text_block("Noted a and b; nothing else is left.")],
            usage={"input_tokens": 50, "output_tokens": 9},
        ),
        MessageReply([text_block("done")]),
    )
    agent = compacting_agent(server)
    events = [e async for e in agent.query("go", stream=False)]
    result = events[-1]
    assert result.subtype == "success" and result.result == "done"
    [compaction] = [e for e in events if e.type == "system" and e.subtype == "compaction"]
    assert compaction.trigger == "overflow" and compaction.compacted_messages == 3
    assert compaction.usage["input_tokens"] == 50

    bodies = server.bodies
    assert len(bodies) == 5 and [is_summary_body(b) for b in bodies] == [False, False, False, True, False]
    summary_request = bodies[3]
    assert summary_request["model"] == "claude-test" and "thinking" not in summary_request
    [only] = summary_request["messages"]
    assert only["role"] == "user" and only["content"][0]["text"].endswith(DEFAULT_COMPACTION_PROMPT)
    # the failed request is retried from the summary and the last kept messages
    assert bodies[4]["messages"] == [
        {"role": "user", "content": [text_block(SUMMARY_PREFIX + "Noted a and b; nothing else is left.")]},
        {"role": "assistant", "content": [note_call("t2", "b")]},
        {"role": "user", "content": [tool_result("t2", "noted b")]},
    ]
    assert bodies[2]["messages"][3:] == bodies[4]["messages"][1:]
    assert [m["role"] for m in await agent.get_history()] == ["user", "assistant", "user", "assistant"]


async def test_a_second_prompt_too_long_in_the_same_query_ends_it_with_a_clear_error(server):
    server.enqueue(
        MessageReply([note_call("t1", "a")], stop_reason="tool_use"),
        MessageReply([note_call("t2", "b")], stop_reason="tool_use"),
        prompt_too_long(250_000),
        MessageReply([text_block("summary")]),
        prompt_too_long(240_000),
    )
    agent = compacting_agent(server)
    result = await agent.prompt("go", stream=False)
    assert result.subtype == "error" and result.is_error and result.error_type == "APIError"
    assert (
        result.error
        == "provider error 400 invalid_request_error: prompt is too long: 240000 tokens > 200000 maximum"
    )
    assert result.exception.status_code == 400
    assert [is_summary_body(b) for b in server.bodies] == [False, False, False, True, False]
    assert server.pending == 0


async def test_without_auto_compact_prompt_too_long_is_the_result_error(server):
    server.enqueue(prompt_too_long())
    result = await agent_on(server).prompt("go", stream=False)
    assert result.subtype == "error" and "prompt is too long: 208656 tokens > 200000 maximum" in result.error
    assert len(server.bodies) == 1
