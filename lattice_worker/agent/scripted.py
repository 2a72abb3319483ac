"""``ScriptedModelClient``: a model client that plays scripted assistant turns.

Used by tests and the offline demo (docs/testing.md). ``ScriptedModelClient(turns)``
takes either

* a list whose items are played in order, one per request: an
  :class:`AssistantModelMessage` (returned), an ``Exception`` instance (raised), or
  a ``callable(request)`` returning an ``AssistantModelMessage`` (or an awaitable of
  one) -- or
* one ``callable(request)`` used for every request (stateless, so it works when a
  run resumes in another process).

Every received :class:`ModelRequest` is recorded on ``.requests`` (with its
``messages`` list copied, so later history growth does not show). A request past
the end of the script raises :class:`ScriptExhaustedError`, which names the
request. With ``request.stream`` and ``request.on_stream_event`` set, the client
emits Anthropic-shaped stream events (``message_start``,
``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``) before returning.

Helpers build turns tersely: :func:`text_turn`, :func:`tool_turn`,
:func:`error_turn`; each takes an optional ``delay`` in **seconds**.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import itertools
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from .model import AssistantModelMessage, ModelRequest, TokenUsage

ScriptItem = AssistantModelMessage | BaseException | Callable[[ModelRequest], Any]


class ScriptExhaustedError(AssertionError):
    """The model was called more times than the script has turns."""


_ids = itertools.count(1)


def new_tool_use_id() -> str:
    """A fresh Anthropic-style tool_use id (``toolu_...``)."""
    return f"toolu_{uuid.uuid4().hex[:20]}{next(_ids):04d}"


def _delayed(message: AssistantModelMessage | BaseException, delay: float | None) -> Any:
    if not delay:
        return message

    async def play(_request: ModelRequest) -> AssistantModelMessage:
        await asyncio.sleep(delay)
        if isinstance(message, BaseException):
            raise message
        return copy.deepcopy(message)

    return play


def text_turn(
    text: str = "",
    *,
    usage: TokenUsage | dict[str, Any] | None = None,
    stop_reason: str | None = "end_turn",
    delay: float | None = None,
    model: str | None = None,
    provider_response_id: str | None = None,
    thinking: str | None = None,
    thinking_signature: str = "sig-scripted",
) -> Any:
    """A turn answering with ``text`` (no text block when ``text`` is ``""``).

    ``thinking`` adds a leading thinking block with ``thinking_signature``.
    ``delay`` (seconds) makes the turn a callable that sleeps first.
    """
    if not isinstance(text, str):
        raise TypeError(f"text_turn: text must be a str, got {type(text).__name__}")
    content: list[dict[str, Any]] = []
    if thinking is not None:
        content.append({"type": "thinking", "thinking": thinking, "signature": thinking_signature})
    if text:
        content.append({"type": "text", "text": text})
    msg = AssistantModelMessage(
        content=content,
        usage=usage,
        stop_reason=stop_reason,
        provider_response_id=provider_response_id,
        model=model,
    )
    return _delayed(msg, delay)


def tool_turn(
    *calls: tuple[str, Any] | tuple[str, Any, str],
    text: str | None = None,
    usage: TokenUsage | dict[str, Any] | None = None,
    stop_reason: str | None = "tool_use",
    delay: float | None = None,
    model: str | None = None,
    provider_response_id: str | None = None,
) -> Any:
    """A turn calling tools: each call is ``(name, input)`` or ``(name, input, id)``;
    ids are generated when omitted. ``text`` adds a leading text block. ``input`` is
    sent as given (so tests can send non-object inputs)."""
    content: list[dict[str, Any]] = []
    if text:
        content.append({"type": "text", "text": text})
    for i, call in enumerate(calls):
        if not isinstance(call, tuple) or len(call) not in (2, 3) or not isinstance(call[0], str):
            raise TypeError(
                f"tool_turn: call {i} must be a tuple (name, input) or (name, input, id) with a str name, "
                f"got {call!r:.80}"
            )
        if len(call) == 3:
            name, inp, tid = call
        else:
            name, inp = call
            tid = new_tool_use_id()
        content.append({"type": "tool_use", "id": tid, "name": name, "input": inp})
    msg = AssistantModelMessage(
        content=content,
        usage=usage,
        stop_reason=stop_reason,
        provider_response_id=provider_response_id,
        model=model,
    )
    return _delayed(msg, delay)


def error_turn(error: BaseException, *, delay: float | None = None) -> Any:
    """A turn that raises ``error`` (after ``delay`` seconds when given)."""
    return _delayed(error, delay)


async def _emit(callback: Callable[[dict[str, Any]], Awaitable[None] | None], event: dict[str, Any]) -> None:
    out = callback(event)
    if inspect.isawaitable(out):
        await out


async def stream_message(
    message: AssistantModelMessage,
    callback: Callable[[dict[str, Any]], Awaitable[None] | None],
    *,
    model: str | None,
) -> None:
    """Emit ``message`` as Anthropic Messages API stream events through ``callback``."""
    usage = TokenUsage.from_any(message.usage)
    await _emit(
        callback,
        {
            "type": "message_start",
            "message": {
                "id": message.provider_response_id or f"msg_scripted_{uuid.uuid4().hex[:12]}",
                "type": "message",
                "role": "assistant",
                "model": message.model or model or "scripted",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": usage.input_tokens, "output_tokens": 0},
            },
        },
    )
    for index, block in enumerate(message.content):
        kind = block.get("type")
        if kind == "text":
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": block.get("text", "")}]
        elif kind == "tool_use":
            start = {"type": "tool_use", "id": block.get("id"), "name": block.get("name"), "input": {}}
            raw = block.get("input")
            text = json.dumps(raw) if raw not in (None, "") else ""
            half = len(text) // 2
            deltas = [
                {"type": "input_json_delta", "partial_json": text[:half]},
                {"type": "input_json_delta", "partial_json": text[half:]},
            ]
        elif kind == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block.get("thinking", "")},
                {"type": "signature_delta", "signature": block.get("signature", "")},
            ]
        else:
            start = copy.deepcopy(block)
            deltas = []
        await _emit(callback, {"type": "content_block_start", "index": index, "content_block": start})
        for delta in deltas:
            await _emit(callback, {"type": "content_block_delta", "index": index, "delta": delta})
        await _emit(callback, {"type": "content_block_stop", "index": index})
    await _emit(
        callback,
        {
            "type": "message_delta",
            "delta": {"stop_reason": message.stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": usage.output_tokens},
        },
    )
    await _emit(callback, {"type": "message_stop"})


class ScriptedModelClient:
    """Plays a script of assistant turns (see the module doc).

    Attributes:
        requests: every :class:`ModelRequest` received, in order.
        remaining: how many list items are left (``None`` for a single callable).
    """

    def __init__(self, turns: Sequence[ScriptItem] | Callable[[ModelRequest], Any]) -> None:
        if callable(turns) and not isinstance(turns, Sequence):
            self._script: list[ScriptItem] | None = None
            self._fn: Callable[[ModelRequest], Any] | None = turns
        elif isinstance(turns, Sequence) and not isinstance(turns, str | bytes):
            for i, item in enumerate(turns):
                if isinstance(item, type) and issubclass(item, BaseException):
                    raise TypeError(
                        f"ScriptedModelClient: turn {i} is the exception class {item.__name__}; put an "
                        f"instance in the script, e.g. {item.__name__}('...')"
                    )
                if not isinstance(item, AssistantModelMessage | BaseException) and not callable(item):
                    raise TypeError(
                        f"ScriptedModelClient: turn {i} is {type(item).__name__}; expected an "
                        "AssistantModelMessage, an Exception or a callable(request)"
                    )
            self._script = list(turns)
            self._fn = None
        else:
            raise TypeError("ScriptedModelClient: turns must be a list of turns or one callable(request)")
        self._next = 0
        self.requests: list[ModelRequest] = []

    @property
    def remaining(self) -> int | None:
        return None if self._script is None else len(self._script) - self._next

    def _describe(self, request: ModelRequest) -> str:
        last = request.messages[-1] if request.messages else None
        text = json.dumps(last, default=str)
        if len(text) > 300:
            text = text[:297] + "..."
        return f"request #{len(self.requests)} (model={request.model!r}, last message: {text})"

    async def create_message(self, request: ModelRequest) -> AssistantModelMessage:
        """Play the next turn for ``request`` (see the module doc).

        Raises :class:`ScriptExhaustedError` past the end of the script, or the
        scripted exception.
        """
        recorded = copy.copy(request)
        recorded.messages = list(request.messages)
        self.requests.append(recorded)
        if self._fn is not None:
            item: ScriptItem = self._fn
        else:
            assert self._script is not None
            if self._next >= len(self._script):
                raise ScriptExhaustedError(
                    f"ScriptedModelClient: unexpected {self._describe(request)}; "
                    f"the script has only {len(self._script)} turn(s)"
                )
            item = self._script[self._next]
            self._next += 1
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, AssistantModelMessage):
            message = copy.deepcopy(item)
        else:
            out = item(request)
            if inspect.isawaitable(out):
                out = await out
            if not isinstance(out, AssistantModelMessage):
                raise TypeError(
                    f"ScriptedModelClient: the callable for {self._describe(request)} returned "
                    f"{type(out).__name__}, not an AssistantModelMessage"
                )
            message = out
        if message.model is None:
            message.model = request.model or "scripted"
        if request.stream and request.on_stream_event is not None:
            await stream_message(message, request.on_stream_event, model=request.model)
        return message


__all__ = [
    "ScriptExhaustedError",
    "ScriptedModelClient",
    "error_turn",
    "new_tool_use_id",
    "stream_message",
    "text_turn",
    "tool_turn",
]
