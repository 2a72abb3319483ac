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


class ReplayedTurn:
    """The stored history of a re-claimed work item still ends with the
    assistant turn :class:`ReplayModelClient` replays, until the model
    "returns" it: the agent is given the history without it, and the store
    skips the turn's append (it is stored already). A step that stops before
    the replayed call -- parked at the run's budget, its message handed back
    to wait for a rate-limit turn, a crash -- leaves the turn stored, so the
    next claim replays it again; dropped from the store first, a real model
    would be asked that turn again and give its calls new ids (the interrupted
    call unknown to the journal: run again, never decided by its effect).

    A history store uses it as a mixin: ``load`` returns :meth:`held_history`
    when not ``None``; ``append`` returns at once when :meth:`append_held`
    handled the message; ``replace`` calls :meth:`release` first."""

    _held: tuple[list[dict[str, Any]], dict[str, Any]] | None = None

    def hold(self, history: list[dict[str, Any]], turn: dict[str, Any]) -> None:
        """The stored list is ``history`` + ``turn`` (the turn to replay)."""
        self._held = (list(history), turn)

    def held_history(self) -> list[dict[str, Any]] | None:
        """The history without the held turn (a copy), or ``None`` when nothing is held."""
        return None if self._held is None else json.loads(json.dumps(self._held[0]))

    def release(self) -> None:
        """The stored list is about to be replaced: nothing is held any more."""
        self._held = None

    def skips_append(self, message: dict[str, Any]) -> list[dict[str, Any]] | None:
        """For the first append while a turn is held: ``[]`` when ``message``
        is that turn (already stored: skip it); else the whole history the
        store must be replaced with (the history before the turn, then
        ``message``). ``None`` when nothing is held (append as usual)."""
        held, self._held = self._held, None
        if held is None:
            return None
        history, turn = held
        same = {"role": message.get("role"), "content": message.get("content")} == {
            "role": turn.get("role"),
            "content": turn.get("content"),
        }
        return [] if same else [*history, message]

    async def append_held(self, message: dict[str, Any]) -> bool:
        """What a store's ``append`` does first: ``True`` when ``message`` was
        handled here (the held turn, stored already: skipped; another message:
        the store replaced with the history before the turn, then ``message``,
        through the store's own ``replace``), ``False`` when nothing is held
        (append as usual)."""
        redo = self.skips_append(message)
        if redo is None:
            return False
        if redo:
            await self.replace(redo)  # type: ignore[attr-defined]  # the host store's
        return True


__all__ = ["ReplayModelClient", "ReplayedTurn", "encode_message"]
