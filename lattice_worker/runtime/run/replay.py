"""Rebuilding a step from what a dead worker persisted: the stored form of a
history message and a model client that first replays a persisted turn.

:class:`ReplayModelClient` lets a recovering step (a lead segment recovered by
the reaper, a member's re-claimed work item) finish the assistant turn the
dead worker had started: the persisted assistant message is "returned by the
model" once, so the loop runs that tool batch again through the normal path
(hooks, events, journal), and calls already completed are found in the
journal instead of being run twice (docs/tool-effects.md).
"""

from __future__ import annotations

import json
from typing import Any

from ...agent.model import AssistantModelMessage


def encode_message(message: Any, where: str) -> bytes:
    """A history message as stored (compact JSON, UTF-8); ``TypeError`` for a non-dict or non-JSON one."""
    if not isinstance(message, dict):
        raise TypeError(f"{where}: a history message must be a dict, got {type(message).__name__}")
    try:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{where}: history message is not JSON-serialisable: {exc}") from exc
    return text.encode("utf-8")


class ReplayModelClient:
    """A model client that first returns ``reply`` (a persisted assistant
    message, wire format) without calling anything, then hands every later
    request to the real client (``inner``, or -- when ``None`` -- an
    ``AnthropicModelClient(api_key=, base_url=)`` built on first use, as an
    ``Agent`` without a client would)."""

    def __init__(
        self, reply: dict[str, Any], inner: Any, *, api_key: str | None = None, base_url: str | None = None
    ) -> None:
        content = reply.get("content")
        if not isinstance(content, list):
            content = [{"type": "text", "text": str(content or "")}]
        self._reply: list[dict[str, Any]] | None = content
        self._inner = inner
        self._api_key = api_key
        self._base_url = base_url

    async def create_message(self, request: Any) -> AssistantModelMessage:
        if self._reply is not None:
            content, self._reply = self._reply, None
            calls = any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)
            return AssistantModelMessage(content=content, stop_reason="tool_use" if calls else "end_turn")
        if self._inner is None:
            from ...agent.anthropic_client import AnthropicModelClient

            self._inner = AnthropicModelClient(api_key=self._api_key, base_url=self._base_url)
        return await self._inner.create_message(request)


__all__ = ["ReplayModelClient", "encode_message"]
