"""AnthropicModelClient through the real ``anthropic`` SDK over HTTP, against the
fake Messages API server on 127.0.0.1 (tests/support/fake_anthropic.py).

The wire format, token usage, provider metadata and streaming events
(docs/testing.md, "Testing against an Anthropic-compatible server").
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import warnings
from typing import Any

import pytest
from pydantic import BaseModel

from lattice_worker import create_agent, tool
from lattice_worker.agent.abort import AbortController
from lattice_worker.agent.anthropic_client import (
    DEEPSEEK_ANTHROPIC_BASE_URL,
    DEFAULT_MODEL,
    AnthropicModelClient,
)
from lattice_worker.agent.model import AssistantModelMessage, ModelRequest, TokenUsage
from lattice_worker.errors import AbortError, APIError, ConfigError, ModelTimeoutError
from tests.support.fake_anthropic import (
    ErrorReply,
    FakeAnthropicServer,
    MessageReply,
    RecordedRequest,
    StreamReply,
    redacted_thinking_block,
    text_block,
    thinking_block,
    tool_use_block,
)

pytestmark = pytest.mark.timeout(60)

USER_HI = [{"role": "user", "content": "hi"}]


def make_client(server: FakeAnthropicServer, **kwargs: Any) -> AnthropicModelClient:
    kwargs.setdefault("max_retries", 0)
    return AnthropicModelClient(api_key="test-key", base_url=server.url, **kwargs)


def sent_key(recorded: RecordedRequest) -> str | None:
    """The API key a request carried (``x-api-key``, or a bearer token in some SDK releases)."""
    if "x-api-key" in recorded.headers:
        return recorded.headers["x-api-key"]
    auth = recorded.headers.get("authorization", "")
    return auth.removeprefix("Bearer ") if auth else None


def request(**kwargs: Any) -> ModelRequest:
    kwargs.setdefault("model", "claude-requested")
    kwargs.setdefault("system", None)
    kwargs.setdefault("messages", list(USER_HI))
    return ModelRequest(**kwargs)


# -- streaming --------------------------------------------------------------------------------------


async def test_streamed_tool_input_in_fragments_is_joined_and_parsed(server: FakeAnthropicServer) -> None:
    tool_input = {"path": "src/app.py", "lines": [1, 2, 3], "options": {"dry_run": True, "note": "a,b:c"}}
    server.enqueue(
        MessageReply(
            [text_block("Let me look."), tool_use_block("toolu_1", "read_file", tool_input)],
            stop_reason="tool_use",
            tool_input_chunks=6,
        )
    )
    events: list[dict[str, Any]] = []
    reply = await make_client(server).create_message(request(on_stream_event=events.append))

    fragments = [
        e["delta"]["partial_json"]
        for e in events
        if e["type"] == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    ]
    assert len(fragments) == 6
    for piece in fragments:  # no fragment is a JSON document on its own
        with pytest.raises(json.JSONDecodeError):
            json.loads(piece)
    assert json.loads("".join(fragments)) == tool_input
    assert reply.content == [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": tool_input},
    ]
    assert reply.stop_reason == "tool_use"
    assert server.requests[0].body["stream"] is True


async def test_streamed_tool_with_empty_input_is_an_empty_dict(server: FakeAnthropicServer) -> None:
    server.enqueue(MessageReply([tool_use_block("toolu_1", "team_status", {})], stop_reason="tool_use"))
    events: list[dict[str, Any]] = []
    reply = await make_client(server).create_message(request(on_stream_event=events.append))
    assert [e["delta"] for e in events if e["type"] == "content_block_delta"] == [
        {"type": "input_json_delta", "partial_json": ""}
    ]
    assert reply.content == [{"type": "tool_use", "id": "toolu_1", "name": "team_status", "input": {}}]


async def test_tool_input_given_whole_at_block_start_is_kept(server: FakeAnthropicServer) -> None:
    # Some compatible providers put the complete input in content_block_start and send no deltas.
    server.enqueue(
        StreamReply(
            [
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_w",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "usage": {"input_tokens": 3, "output_tokens": 1},
                    },
                },
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "add",
                        "input": {"a": 1, "b": 2},
                    },
                },
                {"type": "content_block_stop", "index": 0},
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "tool_use"},
                    "usage": {"output_tokens": 7},
                },
                {"type": "message_stop"},
            ]
        )
    )
    reply = await make_client(server).create_message(request())
    assert reply.content == [{"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1, "b": 2}}]
    assert TokenUsage.from_any(reply.usage).to_dict() == {
        "input_tokens": 3,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


async def test_stream_events_are_delivered_while_the_response_is_still_arriving(
    server: FakeAnthropicServer,
) -> None:
    # The server sends message_start (+ ping), then waits until the test's callback has seen
    # message_start. A client that buffered the response before calling back would never
    # release it: the server then drops the connection and the request fails.
    released = threading.Event()
    server.enqueue(MessageReply([text_block("streaming works")], hold=released, hold_after=2, hold_timeout=5))
    seen_before_release: list[str] = []

    def on_event(event: dict[str, Any]) -> None:
        if not released.is_set():
            seen_before_release.append(event["type"])
            released.set()

    reply = await make_client(server).create_message(request(on_stream_event=on_event))
    assert seen_before_release == ["message_start"]
    assert reply.content == [{"type": "text", "text": "streaming works"}]


async def test_async_stream_callback_is_awaited_in_order(server: FakeAnthropicServer) -> None:
    server.enqueue(MessageReply([text_block("abcdef")], text_chunks=3))
    seen: list[str] = []

    async def on_event(event: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        seen.append(event["type"])

    await make_client(server).create_message(request(on_stream_event=on_event))
    assert seen == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


@pytest.mark.parametrize("stream", [True, False])
async def test_thinking_blocks_keep_signature_and_redacted_data(
    server: FakeAnthropicServer, stream: bool
) -> None:
    content = [
        thinking_block("First, the user wants a sum.", "EqQBCkYIARgCKkB-signature=="),
        redacted_thinking_block("EmwKAhgBEgy3va3pzix/LafPsn4a"),
        tool_use_block("toolu_9", "add", {"a": 2, "b": 3}),
    ]
    server.enqueue(MessageReply(content, stop_reason="tool_use", thinking_chunks=4))
    reply = await make_client(server).create_message(request(stream=stream))
    assert reply.content == content


async def test_thinking_block_is_sent_back_unchanged(server: FakeAnthropicServer) -> None:
    thinking = thinking_block("Need the tool.", "sig-abc/123+==")
    redacted = redacted_thinking_block("opaque-data")
    server.enqueue(
        MessageReply(
            [thinking, redacted, tool_use_block("toolu_1", "add", {"a": 1})], stop_reason="tool_use"
        ),
        MessageReply([text_block("done")]),
    )
    client = make_client(server)
    first = await client.create_message(request())
    history = [
        *USER_HI,
        first.to_dict(),  # carries usage / stop_reason / ids, which must not reach the wire
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "1"}]},
    ]
    await client.create_message(request(messages=history))
    sent = server.requests[1].body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": [thinking, redacted, tool_use_block("toolu_1", "add", {"a": 1})],
    }


# -- metadata ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_usage_stop_reason_id_and_served_model(server: FakeAnthropicServer, stream: bool) -> None:
    usage = {
        "input_tokens": 120,
        "output_tokens": 42,
        "cache_creation_input_tokens": 7,
        "cache_read_input_tokens": 64,
    }
    server.enqueue(
        MessageReply(
            [text_block("partial")],
            stop_reason="max_tokens",
            usage=usage,
            model="claude-served",
            id="msg_01XYZ",
        )
    )
    reply = await make_client(server).create_message(request(stream=stream))
    assert isinstance(reply, AssistantModelMessage)
    assert TokenUsage.from_any(reply.usage).to_dict() == usage
    assert reply.stop_reason == "max_tokens"
    assert reply.provider_response_id == "msg_01XYZ"
    assert reply.model == "claude-served"
    assert server.requests[0].body["model"] == "claude-requested"
    assert server.requests[0].body.get("stream", False) is stream


async def test_non_streaming_json_path(server: FakeAnthropicServer) -> None:
    server.enqueue(MessageReply([text_block("4")], usage={"input_tokens": 9, "output_tokens": 1}))
    events: list[dict[str, Any]] = []
    reply = await make_client(server, default_model="claude-default").create_message(
        request(model=None, system="Be brief.", stream=False, on_stream_event=events.append, max_tokens=256)
    )
    body = server.requests[0].body
    assert "stream" not in body
    assert body["model"] == "claude-default"
    assert body["system"] == "Be brief."
    assert body["max_tokens"] == 256
    assert body["messages"] == USER_HI
    assert events == []  # nothing is streamed on the JSON path
    assert reply.content == [{"type": "text", "text": "4"}]
    assert reply.stop_reason == "end_turn"
    assert reply.model == "claude-default"
    assert reply.provider_response_id and reply.provider_response_id.startswith("msg_")


async def test_tools_and_headers_reach_the_wire(server: FakeAnthropicServer) -> None:
    tools = [
        {"name": "add", "description": "Add two ints.", "input_schema": {"type": "object", "properties": {}}}
    ]
    server.enqueue("ok")
    await make_client(server).create_message(request(tools=tools, timeout_ms=2500))
    recorded = server.requests[0]
    assert recorded.path == "/v1/messages"
    assert recorded.body["tools"] == tools
    assert sent_key(recorded) == "test-key"
    assert recorded.headers["x-stainless-timeout"] == "2.5"  # timeout_ms / 1000 seconds


# -- wire format of thinking / reasoning / output format ------------------------------------------------


@pytest.mark.parametrize(
    ("thinking", "max_tokens", "expected"),
    [
        ({"type": "enabled", "budget_tokens": 2048}, 4096, {"type": "enabled", "budget_tokens": 2048}),
        ({"type": "enabled", "budgetTokens": 2048}, 4096, {"type": "enabled", "budget_tokens": 2048}),
        ({"type": "enabled", "budget_tokens": 50_000}, 8000, {"type": "enabled", "budget_tokens": 7999}),
        ({"type": "adaptive"}, 4096, {"type": "adaptive"}),
        ({"type": "disabled"}, 4096, {"type": "disabled"}),
    ],
)
async def test_thinking_config_wire_format(
    server: FakeAnthropicServer, thinking: dict[str, Any], max_tokens: int, expected: dict[str, Any]
) -> None:
    server.enqueue("ok")
    await make_client(server).create_message(request(thinking=thinking, max_tokens=max_tokens))
    assert server.requests[0].body["thinking"] == expected


async def test_unset_options_send_nothing(server: FakeAnthropicServer) -> None:
    server.enqueue("ok")
    await make_client(server).create_message(request())
    body = server.requests[0].body
    assert not {"thinking", "reasoning_effort", "output_config", "system", "tools"} & body.keys()


async def test_default_model_is_current_and_not_deprecated_by_the_sdk(server: FakeAnthropicServer) -> None:
    # The SDK warns (DeprecationWarning) when a request names a model on its deprecation list.
    server.enqueue("ok", "ok")
    client = AnthropicModelClient(api_key="test-key", base_url=server.url, max_retries=0)
    assert client.default_model == DEFAULT_MODEL == "claude-sonnet-4-6"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await client.create_message(request(model=None))
        await client.create_message(request(model=None, stream=False))
    assert [r.body["model"] for r in server.requests] == ["claude-sonnet-4-6"] * 2
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning) and "model" in str(w.message)]


@pytest.mark.parametrize("effort", ["low", "high", "max"])
async def test_reasoning_effort_is_a_top_level_field(server: FakeAnthropicServer, effort: str) -> None:
    server.enqueue("ok")
    await make_client(server).create_message(request(reasoning_effort=effort))
    body = server.requests[0].body
    assert body["reasoning_effort"] == effort
    assert "thinking" not in body


async def test_output_format_maps_to_output_config(server: FakeAnthropicServer) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "number"}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    server.enqueue('{"answer": 4}', '{"ok": true}')
    client = make_client(server)
    first = await client.create_message(request(output_format={"type": "json_schema", "schema": schema}))
    await client.create_message(request(output_format="json", stream=False))
    assert server.requests[0].body["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    assert server.requests[1].body["output_config"] == {
        "format": {"type": "json_schema", "schema": {"type": "object"}}
    }
    assert first.content == [{"type": "text", "text": '{"answer": 4}'}]  # final text unchanged


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("thinking", {"type": "sometimes"}, "thinking_config type"),
        ("thinking", {"type": "enabled"}, "budget_tokens"),
        ("thinking", "adaptive", "thinking_config"),
        ("reasoning_effort", "medium", "reasoning_effort"),
        ("output_format", "xml", "output_format"),
        ("output_format", {"type": "json_schema"}, "schema"),
        ("timeout_ms", -5, "timeout_ms"),
        ("max_tokens", 0, "max_tokens"),
    ],
)
async def test_bad_request_fields_raise_config_error_before_sending(
    server: FakeAnthropicServer, field: str, value: Any, needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        await make_client(server).create_message(request(**{field: value}))
    assert server.requests == []


async def test_long_non_streaming_request_without_timeout_is_refused(server: FakeAnthropicServer) -> None:
    # The SDK refuses a non-streaming request that may run past 10 minutes; it surfaces as ConfigError.
    with pytest.raises(ConfigError, match="[Ss]treaming"):
        await make_client(server).create_message(request(stream=False, max_tokens=64_000))
    assert server.requests == []
    server.enqueue("ok")  # with an explicit deadline the SDK lets it through
    await make_client(server).create_message(request(stream=False, max_tokens=64_000, timeout_ms=30_000))
    assert server.requests[0].body["max_tokens"] == 64_000


async def test_stream_events_handed_out_are_not_mutated_by_assembly(server: FakeAnthropicServer) -> None:
    citation = {
        "type": "char_location",
        "cited_text": "sky",
        "document_index": 0,
        "start_char_index": 0,
        "end_char_index": 3,
    }
    server.enqueue(
        StreamReply(
            [
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_c",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "usage": {"input_tokens": 1, "output_tokens": 1},
                    },
                },
                {
                    "type": "content_block_start",
                    "index": 0,
                    "content_block": {"type": "text", "text": "", "citations": []},
                },
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "citations_delta", "citation": citation},
                },
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": "The sky"},
                },
                {"type": "content_block_stop", "index": 0},
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn"},
                    "usage": {"output_tokens": 2},
                },
                {"type": "message_stop"},
            ]
        )
    )
    events: list[dict[str, Any]] = []
    reply = await make_client(server).create_message(request(on_stream_event=events.append))
    assert reply.content == [{"type": "text", "text": "The sky", "citations": [citation]}]
    start = next(e for e in events if e["type"] == "content_block_start")
    assert start["content_block"] == {"type": "text", "text": "", "citations": []}


# -- retries and errors -----------------------------------------------------------------------------


async def test_529_is_retried_by_the_sdk(server: FakeAnthropicServer) -> None:
    server.enqueue(ErrorReply(529), MessageReply([text_block("after retry")]))
    reply = await make_client(server, max_retries=2).create_message(request())
    assert reply.content == [{"type": "text", "text": "after retry"}]
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]
    assert server.requests[0].body == server.requests[1].body


async def test_retries_exhausted_raise_api_error_with_status_and_body(server: FakeAnthropicServer) -> None:
    server.enqueue(ErrorReply(529), ErrorReply(529), ErrorReply(529, message="still overloaded"))
    with pytest.raises(APIError) as info:
        await make_client(server, max_retries=2).create_message(request(stream=False))
    assert len(server.requests) == 3
    assert info.value.status_code == 529
    assert info.value.body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "still overloaded"},
    }
    assert "still overloaded" in str(info.value)


async def test_400_is_not_retried_and_keeps_the_error_body(server: FakeAnthropicServer) -> None:
    server.enqueue(ErrorReply(400, "invalid_request_error", "messages: roles must alternate"))
    with pytest.raises(APIError) as info:
        await make_client(server, max_retries=2).create_message(request())
    assert len(server.requests) == 1
    assert info.value.status_code == 400
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert "roles must alternate" in str(info.value)


async def test_error_event_inside_a_stream(server: FakeAnthropicServer) -> None:
    server.enqueue(
        StreamReply(
            [
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_e",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "usage": {"input_tokens": 1, "output_tokens": 1},
                    },
                },
                ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
            ]
        )
    )
    events: list[dict[str, Any]] = []
    with pytest.raises(APIError) as info:
        await make_client(server).create_message(request(on_stream_event=events.append))
    assert [e["type"] for e in events] == ["message_start"]
    assert info.value.status_code == 529
    assert info.value.body["error"]["type"] == "overloaded_error"


async def test_stream_cut_off_before_message_stop(server: FakeAnthropicServer) -> None:
    server.enqueue(
        StreamReply(
            [
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_c",
                        "type": "message",
                        "role": "assistant",
                        "model": "m",
                        "content": [],
                        "usage": {"input_tokens": 1, "output_tokens": 1},
                    },
                },
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "half"}},
            ]
        )
    )
    with pytest.raises(APIError, match="before the message was complete"):
        await make_client(server).create_message(request())


def _cut_tool_stream(stop_reason: str) -> StreamReply:
    return StreamReply(
        [
            {
                "type": "message_start",
                "message": {
                    "id": "msg_t",
                    "type": "message",
                    "role": "assistant",
                    "model": "m",
                    "content": [],
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                },
            },
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "tool_use", "id": "t1", "name": "write", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "input_json_delta", "partial_json": '{"text": "abc'},
            },
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop_reason}, "usage": {"output_tokens": 5}},
            {"type": "message_stop"},
        ]
    )


@pytest.mark.parametrize("stop_reason", ["max_tokens", "tool_use"])
async def test_tool_input_that_is_not_json_stays_the_joined_text(
    server: FakeAnthropicServer, stop_reason: str
) -> None:
    # The client does not fail the request: the loop stores {} and answers the call with an
    # error result (tests/integration/test_loop_rules_sdk.py drives that through an Agent).
    server.enqueue(_cut_tool_stream(stop_reason))
    reply = await make_client(server).create_message(request())
    assert reply.stop_reason == stop_reason
    assert reply.content == [{"type": "tool_use", "id": "t1", "name": "write", "input": '{"text": "abc'}]


async def test_timeout_ms_raises_model_timeout_error(server: FakeAnthropicServer) -> None:
    server.enqueue(MessageReply([text_block("late")], delay=1.0))
    with pytest.raises(ModelTimeoutError) as info:
        await make_client(server).create_message(request(timeout_ms=200, stream=False))
    assert isinstance(info.value, TimeoutError)


async def test_overall_deadline_covers_retries(server: FakeAnthropicServer) -> None:
    # Each attempt answers 529 after 150 ms; with 5 retries the SDK would keep going
    # for ~900 ms, but timeout_ms=400 bounds the whole call.
    server.enqueue(*[ErrorReply(529, delay=0.15) for _ in range(6)])
    with pytest.raises(ModelTimeoutError):
        await make_client(server, max_retries=5).create_message(request(timeout_ms=400))
    assert len(server.requests) < 6


async def test_connection_error_is_an_api_error_without_status() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = AnthropicModelClient(api_key="k", base_url=f"http://127.0.0.1:{port}", max_retries=0)
    with pytest.raises(APIError) as info:
        await client.create_message(request())
    assert info.value.status_code is None
    assert not isinstance(info.value, ModelTimeoutError)


async def test_abort_signal_cancels_the_request(server: FakeAnthropicServer) -> None:
    held = threading.Event()
    server.enqueue(MessageReply([text_block("never")], hold=held, hold_after=2, hold_timeout=10))
    controller = AbortController()

    def on_event(event: dict[str, Any]) -> None:
        controller.abort("user pressed stop")

    try:
        with pytest.raises(AbortError, match="user pressed stop"):
            await make_client(server).create_message(
                request(signal=controller.signal, on_stream_event=on_event)
            )
    finally:
        held.set()
    assert len(server.requests) == 1


async def test_already_aborted_signal_sends_nothing(server: FakeAnthropicServer) -> None:
    controller = AbortController()
    controller.abort()
    with pytest.raises(AbortError):
        await make_client(server).create_message(request(signal=controller.signal))
    assert server.requests == []


# -- construction, environment, event loops ------------------------------------------------------------


def test_constructor_rejects_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="max_retries"):
        AnthropicModelClient(api_key="k", max_retries=-1)
    with pytest.raises(ConfigError, match="max_retries"):
        AnthropicModelClient(api_key="k", max_retries="2")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="api_key"):
        AnthropicModelClient(api_key=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="base_url"):
        AnthropicModelClient(api_key="k", base_url="")


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-key")
    client = AnthropicModelClient()
    assert (client.api_key, client.base_url) == ("ds-key", DEEPSEEK_ANTHROPIC_BASE_URL)

    monkeypatch.setenv("ANTHROPIC_API_KEY", "an-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9/anthropic")
    client = AnthropicModelClient()
    assert (client.api_key, client.base_url) == ("an-key", "http://127.0.0.1:9/anthropic")

    client = AnthropicModelClient(api_key="explicit", base_url="http://example.invalid")
    assert (client.api_key, client.base_url) == ("explicit", "http://example.invalid")


def test_env_key_and_base_url_reach_the_server(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("DEEPSEEK_API_KEY", "ds-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.url)
    server.enqueue("ok")
    client = AnthropicModelClient(max_retries=0)
    asyncio.run(client.create_message(request()))
    assert sent_key(server.requests[0]) == "ds-from-env"


def test_one_instance_works_across_event_loops_and_threads(server: FakeAnthropicServer) -> None:
    server.responder = lambda req: "pong"
    client = make_client(server)

    async def call() -> str:
        reply = await client.create_message(request())
        return reply.content[0]["text"]

    # Two loops one after another: a connection pool bound to the first (closed) loop would break the second.
    assert asyncio.run(call()) == "pong"
    assert asyncio.run(call()) == "pong"

    results: list[str] = []
    errors: list[BaseException] = []

    def in_thread() -> None:
        try:
            results.append(asyncio.run(call()))
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=in_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert results == ["pong"] * 3
    assert len(server.requests) == 5


async def test_given_sdk_client_is_used(server: FakeAnthropicServer) -> None:
    import anthropic

    sdk = anthropic.AsyncAnthropic(api_key="from-given-client", base_url=server.url, max_retries=0)
    server.enqueue("ok")
    await AnthropicModelClient(client=sdk).create_message(request())
    assert sent_key(server.requests[0]) == "from-given-client"
    await sdk.close()


async def test_unscripted_request_is_reported_by_the_fake_server(server: FakeAnthropicServer) -> None:
    with pytest.raises(APIError) as info:
        await make_client(server, max_retries=2).create_message(request())
    assert info.value.status_code == 500
    assert len(server.unexpected) == 1
    assert len(server.requests) == 1  # x-should-retry: false stops SDK retries


# -- through the Agent loop ---------------------------------------------------------------------------


class AddInput(BaseModel):
    a: int
    b: int


def make_agent(server: FakeAnthropicServer, seen: list[dict[str, Any]] | None = None, **options: Any) -> Any:
    async def add(args: AddInput) -> str:
        if seen is not None:
            seen.append(args.model_dump())
        return str(args.a + args.b)

    return create_agent(
        model_client=AnthropicModelClient(api_key="test-key", base_url=server.url, max_retries=2),
        tools=[tool("add", "Add two integers.", AddInput, add)],
        model="claude-test-model",
        **options,
    )


async def test_agent_echoes_thinking_with_signature_and_runs_the_fragmented_tool_call(
    server: FakeAnthropicServer,
) -> None:
    thinking = thinking_block("I should add 2 and 3 with the tool.", "EqQBCkYIARgCKkBsig+/==")
    redacted = redacted_thinking_block("EmwKAhgBEgy3va3pzix")
    call = tool_use_block("toolu_01", "add", {"a": 2, "b": 3})
    server.enqueue(
        MessageReply(
            [thinking, redacted, call],
            stop_reason="tool_use",
            tool_input_chunks=4,
            usage={"input_tokens": 50, "output_tokens": 20, "cache_read_input_tokens": 8},
            model="claude-served-1",
            id="msg_turn1",
        ),
        MessageReply(
            [text_block("2 + 3 = 5")], usage={"input_tokens": 80, "output_tokens": 6}, id="msg_turn2"
        ),
    )
    seen: list[dict[str, Any]] = []
    agent = make_agent(server, seen, thinking_config={"type": "enabled", "budget_tokens": 2048})
    events = [event async for event in agent.query("What is 2 + 3?")]

    assert seen == [{"a": 2, "b": 3}]  # the tool got the input joined from 4 fragments
    result = events[-1]
    assert (result.type, result.subtype, result.is_error, result.result) == (
        "result",
        "success",
        False,
        "2 + 3 = 5",
    )
    assert result.usage == {
        "input_tokens": 130,
        "output_tokens": 26,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 8,
    }

    assistants = [e for e in events if e.type == "assistant"]
    assert assistants[0].message["content"] == [thinking, redacted, call]
    assert assistants[0].message["provider_response_id"] == "msg_turn1"
    assert assistants[0].message["model"] == "claude-served-1"
    assert assistants[0].message["stop_reason"] == "tool_use"
    fragments = [
        e.event["delta"]["partial_json"]
        for e in events
        if e.type == "stream_event" and e.event.get("delta", {}).get("type") == "input_json_delta"
    ]
    assert len(fragments) == 4

    second = server.requests[1].body
    assert second["messages"][0] == {"role": "user", "content": "What is 2 + 3?"}
    assert second["messages"][1] == {"role": "assistant", "content": [thinking, redacted, call]}
    tool_result = second["messages"][2]["content"][0]
    assert (tool_result["type"], tool_result["tool_use_id"]) == ("tool_result", "toolu_01")
    assert second["thinking"] == {"type": "enabled", "budget_tokens": 2048}


async def test_agent_request_error_400_is_a_result_with_subtype_error(server: FakeAnthropicServer) -> None:
    server.enqueue(ErrorReply(400, "invalid_request_error", "max_tokens: must be at most 64000"))
    result = await make_agent(server).prompt("hello")
    assert (result.subtype, result.is_error) == ("error", True)
    assert result.error_type == "APIError"
    assert "must be at most 64000" in (result.error or "")
    assert len(server.requests) == 1  # a 400 is not retried


async def test_agent_529_is_retried_and_the_run_succeeds(server: FakeAnthropicServer) -> None:
    server.enqueue(ErrorReply(529), MessageReply([text_block("fine now")]))
    result = await make_agent(server).prompt("hello", stream=False)
    assert (result.subtype, result.result) == ("success", "fine now")
    assert [r.headers["x-stainless-retry-count"] for r in server.requests] == ["0", "1"]


async def test_agent_options_reach_the_wire(server: FakeAnthropicServer) -> None:
    server.enqueue("{}", "{}")
    agent = make_agent(server, thinking_config={"type": "disabled"}, reasoning_effort="low")
    await agent.prompt("one")
    schema = {"type": "object", "properties": {}, "additionalProperties": False}
    await agent.prompt(
        "two", thinking_config={"type": "adaptive"}, output_format={"type": "json_schema", "schema": schema}
    )
    first, second = (r.body for r in server.requests)
    assert first["thinking"] == {"type": "disabled"}
    assert first["reasoning_effort"] == "low"
    assert "output_config" not in first
    assert second["thinking"] == {"type": "adaptive"}
    assert second["output_config"] == {"format": {"type": "json_schema", "schema": schema}}


async def test_no_api_key_at_all_is_a_clear_config_error(
    server: FakeAnthropicServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("ANTHROPIC_API_KEY", "DEEPSEEK_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    client = AnthropicModelClient(base_url=server.url, max_retries=0)
    for stream in (True, False):
        with pytest.raises(ConfigError, match="no API key.*ANTHROPIC_API_KEY"):
            await client.create_message(request(stream=stream))
    assert server.requests == []
    # through an Agent (the README quickstart without a key): an error result naming the fix, no traceback
    agent = create_agent(model_client=client)
    with caplog.at_level("WARNING", logger="lattice_worker.agent"):
        result = await agent.prompt("What is 2 + 40?")
    assert (result.subtype, result.error_type) == ("error", "ConfigError")
    assert "ANTHROPIC_API_KEY" in (result.error or "")
    assert not [r for r in caplog.records if r.name == "lattice_worker.agent" and r.exc_info]
