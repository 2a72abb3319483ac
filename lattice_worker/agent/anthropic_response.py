"""The Messages API response of :class:`~lattice_worker.agent.anthropic_client.AnthropicModelClient`
as an :class:`~lattice_worker.agent.model.AssistantModelMessage`: content blocks
as wire dicts, and :class:`StreamAssembler`, which builds the message from the
raw events of a streamed response.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from ..errors import APIError
from .model import AssistantModelMessage, TokenUsage

_TOOL_BLOCK_TYPES = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def _clean_block(block: Any) -> dict[str, Any]:
    """A content block as a wire dict: a deep copy without ``None``-valued top-level keys
    (the copy keeps the assembled message independent of the events handed to callers)."""
    if hasattr(block, "to_dict"):
        block = block.to_dict(mode="json")
    return {k: copy.deepcopy(v) for k, v in dict(block).items() if v is not None}


class StreamAssembler:
    """Builds the final assistant message from raw Messages API stream events (dicts).

    ``text_delta``, ``thinking_delta``, ``signature_delta`` and ``citations_delta``
    extend their block; ``input_json_delta`` fragments are collected and joined and
    parsed **once**, at the block's ``content_block_stop`` (or at the end of the
    stream for a block that was never closed). A tool block with no fragments keeps
    the input it started with, or ``{}``. Tool input that is not valid JSON is
    left as the joined text (a string): the agent loop stores ``{}`` for that
    call and answers it with an error result the model can fix (or, when the
    response stopped at ``max_tokens``, with the truncation error).
    """

    def __init__(self) -> None:
        self._message: dict[str, Any] | None = None
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._fragments: dict[int, list[str]] = {}
        self._ended = False

    def feed(self, event: dict[str, Any]) -> None:
        """Apply one raw stream event.

        Raises:
            APIError: an event out of order (a delta for a block that never started).
        """
        kind = event.get("type")
        if kind == "message_start":
            message = dict(event.get("message") or {})
            self._message = message
            self._usage = {k: v for k, v in (message.get("usage") or {}).items() if v is not None}
            for index, block in enumerate(message.get("content") or []):
                self._blocks[index] = _clean_block(block)
        elif kind == "content_block_start":
            index = self._index(event)
            block = _clean_block(event.get("content_block") or {})
            self._blocks[index] = block
            if block.get("type") in _TOOL_BLOCK_TYPES:
                self._fragments[index] = []
        elif kind == "content_block_delta":
            self._apply_delta(self._index(event), event.get("delta") or {})
        elif kind == "content_block_stop":
            self._close_block(self._index(event))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            self._require_message()
            for key in ("stop_reason", "stop_sequence"):
                if key in delta:
                    self._message[key] = delta[key]  # type: ignore[index]
            for key, value in (event.get("usage") or {}).items():
                if value is not None:
                    self._usage[key] = value
        elif kind == "message_stop":
            self._ended = True
        # ``ping`` and unknown event types carry nothing to assemble.

    def _index(self, event: dict[str, Any]) -> int:
        index = event.get("index")
        if not isinstance(index, int):
            raise APIError(f"malformed stream event without an integer index: {event!r:.200}")
        return index

    def _require_message(self) -> None:
        if self._message is None:
            raise APIError("malformed stream: an event arrived before message_start")

    def _apply_delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.get(index)
        if block is None:
            raise APIError(f"malformed stream: a delta for content block {index}, which never started")
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = block.get("text", "") + (delta.get("text") or "")
        elif kind == "input_json_delta":
            self._fragments.setdefault(index, []).append(delta.get("partial_json") or "")
        elif kind == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = block.get("signature", "") + (delta.get("signature") or "")
        elif kind == "citations_delta":
            block.setdefault("citations", []).append(delta.get("citation"))

    def _close_block(self, index: int) -> None:
        fragments = self._fragments.pop(index, None)
        if fragments is None:
            return
        block = self._blocks[index]
        raw = "".join(fragments)
        if not raw.strip():
            start_input = block.get("input")
            block["input"] = start_input if isinstance(start_input, dict) else {}
            return
        try:
            block["input"] = json.loads(raw)
        except json.JSONDecodeError:
            # kept as the raw text: the agent loop stores ``{}`` and answers the call with an
            # error result quoting it, so the model can reissue the call
            block["input"] = raw

    def result(self) -> AssistantModelMessage:
        """The assembled message.

        Raises:
            APIError: the stream had no ``message_start``, or ended before the
                message was finished.
        """
        self._require_message()
        message = self._message or {}
        stop_reason = message.get("stop_reason")
        if not self._ended and stop_reason is None:
            raise APIError("model stream ended before the message was complete (no message_stop)")
        for index in list(self._fragments):
            self._close_block(index)
        return AssistantModelMessage(
            content=[self._blocks[i] for i in sorted(self._blocks)],
            usage=TokenUsage.from_any(self._usage),
            stop_reason=stop_reason,
            provider_response_id=message.get("id"),
            model=message.get("model"),
        )


__all__ = ["StreamAssembler"]
