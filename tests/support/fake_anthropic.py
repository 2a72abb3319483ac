"""A scripted Anthropic-compatible Messages API server for tests.

Start it on 127.0.0.1 (a free port) in a background thread and point the real
``anthropic`` SDK at ``server.url``::

    with FakeAnthropicServer() as server:
        server.enqueue(
            MessageReply([tool_use_block("toolu_1", "add", {"a": 1, "b": 2})], stop_reason="tool_use",
                         tool_input_chunks=4),
            ErrorReply(529),                      # the SDK retries this one
            MessageReply([text_block("3")]),
        )
        client = AnthropicModelClient(api_key="test", base_url=server.url)
        ...
        assert server.requests[1].body["messages"][-1]["content"][0]["type"] == "tool_result"

Replies are taken from the queue in order; when the queue is empty the
``responder`` (``callable(RecordedRequest) -> reply``, sync or async) decides,
which is what whole-team end-to-end tests use. A request with neither gets a
500 carrying ``x-should-retry: false`` and is listed in ``server.unexpected``.

Reply kinds:

* :class:`MessageReply` -- an assistant message. Sent as JSON, or as an SSE
  stream when the request says ``"stream": true`` (tool input split into
  ``tool_input_chunks`` ``input_json_delta`` fragments, thinking blocks with a
  ``signature_delta``). A plain ``str`` reply means one text block.
* :class:`ErrorReply` -- an HTTP error with the Anthropic error body
  (``{"type": "error", "error": {"type": ..., "message": ...}}``) and, by
  default, ``retry-after-ms: 1`` so SDK retries are instant;
  :func:`prompt_too_long` builds the API's context-overflow answer (400).
* :class:`StreamReply` -- hand-written SSE events (e.g. an ``error`` event mid-stream).
* :class:`RawReply` -- any status, body and headers.

Every request is recorded (:class:`RecordedRequest`: method, path, lower-case
headers, parsed JSON body, raw bytes) before it is answered; ``server.bodies``
gives the JSON bodies received, in order.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# -- content block helpers -----------------------------------------------------------------------


def text_block(text: str) -> dict[str, Any]:
    """``{"type": "text", "text": text}``."""
    return {"type": "text", "text": text}


def tool_use_block(id: str, name: str, input: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{"type": "tool_use", "id", "name", "input"}``."""
    return {"type": "tool_use", "id": id, "name": name, "input": {} if input is None else input}


def thinking_block(thinking: str, signature: str) -> dict[str, Any]:
    """``{"type": "thinking", "thinking", "signature"}``."""
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def redacted_thinking_block(data: str) -> dict[str, Any]:
    """``{"type": "redacted_thinking", "data"}``."""
    return {"type": "redacted_thinking", "data": data}


# -- replies -------------------------------------------------------------------------------------


@dataclass
class MessageReply:
    """An assistant message, sent as JSON or SSE depending on the request's ``stream``.

    ``usage`` defaults to ``{"input_tokens": 10, "output_tokens": 5}``; ``model``
    to the requested model; ``id`` to ``msg_fake_<n>``. Streaming shape:
    ``text_chunks`` ``text_delta`` events per text block, ``tool_input_chunks``
    ``input_json_delta`` fragments per tool block (split at character positions,
    so a fragment may end mid-token), ``thinking_chunks`` ``thinking_delta`` events
    then one ``signature_delta``. ``hold`` (a :class:`threading.Event`) pauses the
    stream after ``hold_after`` events until it is set; if it is not set within
    ``hold_timeout`` seconds the connection is dropped, so a client that does not
    deliver events while they arrive fails loudly. ``delay`` (seconds) waits
    before answering. ``force_stream`` overrides the request's ``stream`` flag.
    """

    content: list[dict[str, Any]]
    stop_reason: str | None = "end_turn"
    usage: dict[str, Any] | None = None
    model: str | None = None
    id: str | None = None
    stop_sequence: str | None = None
    text_chunks: int = 2
    tool_input_chunks: int = 3
    thinking_chunks: int = 2
    hold: threading.Event | None = None
    hold_after: int = 1
    hold_timeout: float = 10.0
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    force_stream: bool | None = None


@dataclass
class ErrorReply:
    """An HTTP error with the Anthropic error JSON body.

    ``headers`` default to ``{"retry-after-ms": "1"}`` so the SDK's retries do not sleep.
    """

    status: int = 529
    error_type: str = "overloaded_error"
    message: str = "Overloaded"
    headers: dict[str, str] = field(default_factory=lambda: {"retry-after-ms": "1"})
    delay: float = 0.0

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}


def prompt_too_long(tokens: int = 208_656, maximum: int = 200_000) -> ErrorReply:
    """The Messages API's answer to a request whose input does not fit the context
    window: HTTP 400, ``invalid_request_error``, ``"prompt is too long: <tokens>
    tokens > <maximum> maximum"`` (the wording of the real API)."""
    return ErrorReply(
        400, "invalid_request_error", f"prompt is too long: {tokens} tokens > {maximum} maximum"
    )


@dataclass
class StreamReply:
    """Hand-written SSE events: each item is ``(event_name, data)`` or a ``data`` dict
    whose ``type`` is the event name. ``hold``/``hold_after``/``hold_timeout`` as in
    :class:`MessageReply`."""

    events: list[tuple[str, dict[str, Any]] | dict[str, Any]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    hold: threading.Event | None = None
    hold_after: int = 1
    hold_timeout: float = 10.0
    delay: float = 0.0


@dataclass
class RawReply:
    """Any status, body (bytes, str, or a JSON-able object) and headers."""

    status: int = 200
    body: Any = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    delay: float = 0.0


Reply = MessageReply | ErrorReply | StreamReply | RawReply | str


@dataclass
class RecordedRequest:
    """One request the server received: ``body`` is the parsed JSON (``None`` if it was not JSON)."""

    index: int
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    raw: bytes

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or []) if isinstance(self.body, dict) else []


Responder = Callable[[RecordedRequest], Reply | Awaitable[Reply]]


# -- rendering -----------------------------------------------------------------------------------


def _split(text: str, parts: int) -> list[str]:
    """``text`` in ``parts`` consecutive pieces (fewer if it is shorter); ``[""]`` for ``""``."""
    if not text:
        return [""]
    parts = max(1, min(parts, len(text)))
    size, extra = divmod(len(text), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(text[start:end])
        start = end
    return out


def message_body(reply: MessageReply, *, model: str, message_id: str) -> dict[str, Any]:
    """The non-streaming JSON body of ``reply``."""
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": reply.model or model,
        "content": reply.content,
        "stop_reason": reply.stop_reason,
        "stop_sequence": reply.stop_sequence,
        "usage": dict(reply.usage or {"input_tokens": 10, "output_tokens": 5}),
    }


def message_events(reply: MessageReply, *, model: str, message_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events (``(name, data)``) of ``reply``, shaped like the Messages API stream:
    ``message_start`` (usage with ``output_tokens`` 1), ``ping``, per block
    ``content_block_start`` / ``content_block_delta``... / ``content_block_stop``,
    ``message_delta`` (stop reason, final ``output_tokens``), ``message_stop``."""
    usage = dict(reply.usage or {"input_tokens": 10, "output_tokens": 5})
    start_usage = {**usage, "output_tokens": 1}
    events: list[tuple[str, dict[str, Any]]] = [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": reply.model or model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": start_usage,
                },
            },
        ),
        ("ping", {"type": "ping"}),
    ]
    for index, block in enumerate(reply.content):
        kind = block.get("type")
        if kind == "text":
            start: dict[str, Any] = {**block, "text": ""}
            deltas = [
                {"type": "text_delta", "text": piece}
                for piece in _split(block.get("text", ""), reply.text_chunks)
            ]
        elif kind in ("tool_use", "server_tool_use"):
            start = {**block, "input": {}}
            raw = json.dumps(block.get("input") or {}, separators=(",", ":")) if block.get("input") else ""
            deltas = [
                {"type": "input_json_delta", "partial_json": piece}
                for piece in _split(raw, reply.tool_input_chunks)
            ]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": piece}
                for piece in _split(block.get("thinking", ""), reply.thinking_chunks)
            ]
            deltas.append({"type": "signature_delta", "signature": block.get("signature", "")})
        else:  # redacted_thinking and anything else arrive whole
            start, deltas = dict(block), []
        events.append(
            ("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        )
        for delta in deltas:
            events.append(
                ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": reply.stop_reason, "stop_sequence": reply.stop_sequence},
                "usage": {"output_tokens": usage.get("output_tokens", 0)},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


class _HoldTimeout(Exception):
    pass


async def _sse_body(
    events: list[tuple[str, dict[str, Any]]],
    hold: threading.Event | None,
    hold_after: int,
    hold_timeout: float,
) -> AsyncIterator[bytes]:
    for count, (name, data) in enumerate(events):
        if hold is not None and count == hold_after:
            released = await asyncio.to_thread(hold.wait, hold_timeout)
            if not released:
                raise _HoldTimeout(f"stream hold not released within {hold_timeout}s")
        yield _sse(name, data)


# -- server --------------------------------------------------------------------------------------


class FakeAnthropicServer:
    """The Messages API (``POST /v1/messages``) on 127.0.0.1, in a background thread.

    Args:
        responder: decides the reply when the queue is empty (sync or async callable
            taking a :class:`RecordedRequest`).
        host: interface to bind (loopback by default).
        port: 0 picks a free port.
        start_timeout: seconds :meth:`start` waits for the server to listen.

    Use it as a context manager, or call :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        start_timeout: float = 10.0,
    ) -> None:
        self.responder = responder
        self.host = host
        self._port = port
        self.start_timeout = start_timeout
        self._lock = threading.Lock()
        self._queue: deque[Reply] = deque()
        self._requests: list[RecordedRequest] = []
        self._unexpected: list[RecordedRequest] = []
        self._ids = itertools.count(1)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._errors: list[BaseException] = []

    # -- scripting and inspection -----------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        """Append replies to the queue (answered in order, one per request)."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def pending(self) -> int:
        """Replies still queued."""
        with self._lock:
            return len(self._queue)

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def bodies(self) -> list[Any]:
        """The JSON body of every request received so far, oldest first, exactly as
        sent (parsed from the raw bytes afresh, so callers may change them freely)."""
        with self._lock:
            raws = [r.raw for r in self._requests]
        return [json.loads(raw) if raw else None for raw in raws]

    @property
    def unexpected(self) -> list[RecordedRequest]:
        """Requests that found no queued reply and no responder."""
        with self._lock:
            return list(self._unexpected)

    def clear(self) -> None:
        """Forget recorded requests and queued replies."""
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._unexpected.clear()

    @property
    def port(self) -> int:
        if self._socket is None:
            raise RuntimeError("FakeAnthropicServer is not started")
        return self._socket.getsockname()[1]

    @property
    def url(self) -> str:
        """Base URL for the SDK's ``base_url`` (``http://127.0.0.1:<port>``)."""
        return f"http://{self.host}:{self.port}"

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> FakeAnthropicServer:
        """Bind, start serving in a daemon thread, and wait until it listens.

        Raises:
            RuntimeError: the server did not come up within ``start_timeout`` seconds.
        """
        if self._thread is not None:
            raise RuntimeError("FakeAnthropicServer already started")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self._port))
        self._socket = sock
        config = uvicorn.Config(
            self._app(),
            log_level="warning",
            lifespan="off",
            access_log=False,
            timeout_graceful_shutdown=2,
        )
        server = self._server = uvicorn.Server(config)

        def run() -> None:
            try:
                server.run(sockets=[sock])
            except BaseException as exc:  # noqa: BLE001 - reported by start()
                self._errors.append(exc)

        self._thread = threading.Thread(target=run, name=f"fake-anthropic-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.start_timeout
        while not server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"FakeAnthropicServer failed to start: {self._errors!r}")
            if time.monotonic() >= deadline:
                self.stop()
                raise RuntimeError(f"FakeAnthropicServer did not start within {self.start_timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and join the thread (forcing exit after ``timeout`` seconds)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        if self._socket is not None:
            self._socket.close()
        self._thread = None
        self._server = None

    def __enter__(self) -> FakeAnthropicServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- HTTP ---------------------------------------------------------------------------------

    def _app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/messages", self._handle_messages, methods=["POST"]),
                Route("/{path:path}", self._handle_unknown, methods=["GET", "POST", "PUT", "DELETE"]),
            ]
        )

    async def _record(self, request: Request) -> RecordedRequest:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            recorded = RecordedRequest(
                index=len(self._requests),
                method=request.method,
                path=request.url.path,
                headers={k.lower(): v for k, v in request.headers.items()},
                body=body,
                raw=raw,
            )
            self._requests.append(recorded)
        return recorded

    async def _handle_unknown(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse(
            {
                "type": "error",
                "error": {"type": "not_found_error", "message": f"no route {request.url.path}"},
            },
            status_code=404,
        )

    async def _handle_messages(self, request: Request) -> Response:
        recorded = await self._record(request)
        if not isinstance(recorded.body, dict):
            return JSONResponse(
                ErrorReply(400, "invalid_request_error", "body is not a JSON object").body(), 400
            )
        reply = await self._next_reply(recorded)
        if reply is None:
            with self._lock:
                self._unexpected.append(recorded)
            return JSONResponse(
                {
                    "type": "error",
                    "error": {
                        "type": "api_error",
                        "message": "fake server: no scripted reply for this request",
                    },
                },
                status_code=500,
                headers={"x-should-retry": "false"},
            )
        if isinstance(reply, str):
            reply = MessageReply([text_block(reply)])
        if reply.delay:
            await asyncio.sleep(reply.delay)
        model = str(recorded.body.get("model") or "fake-model")
        if isinstance(reply, ErrorReply):
            return JSONResponse(reply.body(), status_code=reply.status, headers=reply.headers)
        if isinstance(reply, RawReply):
            body = reply.body
            if not isinstance(body, bytes | str):
                body = json.dumps(body)
            return Response(
                body, status_code=reply.status, headers=reply.headers, media_type=reply.content_type
            )
        if isinstance(reply, StreamReply):
            events = [
                item if isinstance(item, tuple) else (str(item.get("type")), item) for item in reply.events
            ]
            return StreamingResponse(
                _sse_body(events, reply.hold, reply.hold_after, reply.hold_timeout),
                status_code=reply.status,
                headers=reply.headers,
                media_type="text/event-stream",
            )
        message_id = reply.id or f"msg_fake_{next(self._ids)}"
        stream = reply.force_stream if reply.force_stream is not None else recorded.stream
        if not stream:
            return JSONResponse(
                message_body(reply, model=model, message_id=message_id), headers=reply.headers
            )
        return StreamingResponse(
            _sse_body(
                message_events(reply, model=model, message_id=message_id),
                reply.hold,
                reply.hold_after,
                reply.hold_timeout,
            ),
            headers=reply.headers,
            media_type="text/event-stream",
        )

    async def _next_reply(self, recorded: RecordedRequest) -> Reply | None:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
            responder = self.responder
        if responder is None:
            return None
        outcome = responder(recorded)
        if inspect.isawaitable(outcome):
            outcome = await outcome
        return outcome


__all__ = [
    "ErrorReply",
    "FakeAnthropicServer",
    "MessageReply",
    "RawReply",
    "RecordedRequest",
    "Reply",
    "Responder",
    "StreamReply",
    "message_body",
    "message_events",
    "prompt_too_long",
    "redacted_thinking_block",
    "text_block",
    "thinking_block",
    "tool_use_block",
]
