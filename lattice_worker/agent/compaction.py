"""Automatic context compaction: the pieces the agent loop puts together.

``auto_compact=True`` (or :class:`~lattice_worker.agent.options.AutoCompactOptions`)
makes the loop replace the older part of a conversation with a model-written
summary (docs/architecture.md describes the agent loop):

* **when** -- between turns, once the last model response reported more
  input tokens than ``threshold_tokens`` (:func:`context_tokens`: uncached,
  cache-read and cache-write input together, which is what fills the
  window); and once per query as a recovery after an overflow
  (:func:`is_overflow_error`, or the stop reason
  ``model_context_window_exceeded``), before the same turn is retried.
  ``max_tokens`` never triggers it: that is the output budget running out.
* **what** -- everything before the last ``keep_recent_messages`` messages
  (:func:`choose_cut`), moved earlier when needed so that no kept message
  refers to a ``tool_use`` that would be dropped; no safe cut -> no compaction.
* **how** -- one extra model request (:func:`summary_request_messages`: the
  older messages rendered as a plain-text transcript followed by the
  instruction, :data:`DEFAULT_COMPACTION_PROMPT` unless ``prompt`` is given;
  no tools, no thinking), then the history becomes
  ``[summary message] + kept messages`` (:func:`compacted_history`).

The loop folds the summary request's usage into the query's usage, writes the
new history through the history store's ``replace`` and emits a ``system``
event with subtype ``"compaction"``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ..errors import APIError, LatticeError
from ..tools.tool_search import loaded_in_history, loaded_note
from .model import AssistantModelMessage, TokenUsage

DEFAULT_COMPACTION_PROMPT = (
    "The conversation above is getting too long for the context window and is about to be replaced by "
    "your summary. Write that summary now. It must let you continue the work without the original "
    "messages, so include: the user's requests and goals, in their own words where it matters; every "
    "decision made and why; what has been done so far and what each tool call found (file paths, "
    "names, identifiers, numbers, errors and their fixes); what is still open, and the exact next "
    "step. Be concrete and complete rather than short. Write only the summary, with no preamble."
)
"""The instruction sent with the transcript when ``AutoCompactOptions.prompt`` is not set."""

SUMMARY_PREFIX = (
    "[Context compaction] The earlier part of this conversation was replaced by the summary below, "
    "written when the context window was filling up. Continue the task from where it stands; do not "
    "start it over.\n\n"
)
"""The text before the summary in the message that replaces the older history."""

TRANSCRIPT_BLOCK_CHARS = 20_000
"""At most this many characters of one block go into the summary request's
transcript (the rest is left out with a note), so one huge block -- the kind
that overflows a window -- cannot overflow the summary request too."""

_OVERFLOW_PATTERNS = re.compile(
    r"prompt is too long|context window|context length|context_length_exceeded|maximum context|"
    r"context limit|exceeded model token limit",
    re.IGNORECASE,
)


class CompactionError(LatticeError):
    """Compaction could not produce a summary (the summary request failed or
    returned no text). The loop then goes on without compacting (a threshold
    compaction) or lets the original overflow surface (a recovery)."""


@dataclass
class Compaction:
    """A finished compaction: the new history, how many messages were
    summarised (``compacted``) and kept (``retained``), and the summary
    request's usage."""

    history: list[dict[str, Any]]
    compacted: int
    retained: int
    usage: TokenUsage


def context_tokens(usage: TokenUsage | dict[str, Any] | None) -> int | None:
    """The input tokens a response reported (uncached + cache read + cache
    creation), or ``None`` when the client reported no usage at all."""
    if usage is None:
        return None
    counted = TokenUsage.from_any(usage)
    return counted.input_tokens + counted.cache_read_input_tokens + counted.cache_creation_input_tokens


def is_overflow_error(exc: BaseException) -> bool:
    """True when ``exc`` is a provider error saying the prompt does not fit the
    context window: an :class:`APIError` with status 400 (or 413, or none: an
    error event inside a stream) whose message says so. Anthropic answers
    ``400 invalid_request_error "prompt is too long: 208656 tokens > 200000
    maximum"``; other compatible providers speak of the "maximum context
    length" or the "context window"."""
    if not isinstance(exc, APIError):
        return False
    if exc.status_code not in (None, 400, 413):
        return False
    text = str(exc)
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            text += " " + error["message"]
    return bool(_OVERFLOW_PATTERNS.search(text))


def _tool_use_ids(message: dict[str, Any]) -> set[str]:
    content = message.get("content")
    if message.get("role") != "assistant" or not isinstance(content, list):
        return set()
    return {
        str(b.get("id"))
        for b in content
        if isinstance(b, dict) and b.get("type") in ("tool_use", "server_tool_use", "mcp_tool_use")
    }


def _tool_result_ids(message: dict[str, Any]) -> set[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return set()
    return {
        str(b.get("tool_use_id"))
        for b in content
        if isinstance(b, dict) and b.get("type") in ("tool_result", "mcp_tool_result")
    }


def choose_cut(history: list[dict[str, Any]], keep_recent_messages: int) -> int | None:
    """The index where the kept part of ``history`` starts, or ``None`` when no
    safe cut leaves anything to summarise.

    Starts at ``len(history) - keep_recent_messages`` and moves earlier (keeping
    more) until no kept message answers a ``tool_use`` that is not kept too.
    """
    cut = len(history) - keep_recent_messages
    while cut > 0:
        kept_uses: set[str] = set()
        answered: set[str] = set()
        for message in history[cut:]:
            if isinstance(message, dict):
                kept_uses |= _tool_use_ids(message)
                answered |= _tool_result_ids(message)
        if answered <= kept_uses:
            return cut
        cut -= 1
    return None


def _clip(text: str) -> str:
    if len(text) <= TRANSCRIPT_BLOCK_CHARS:
        return text
    left = len(text) - TRANSCRIPT_BLOCK_CHARS
    return f"{text[:TRANSCRIPT_BLOCK_CHARS]}\n[... {left:,} more characters left out of this transcript ...]"


def _render_content(content: Any) -> list[str]:
    if isinstance(content, str):
        return [_clip(content)]
    if not isinstance(content, list):
        return [_clip(json.dumps(content, ensure_ascii=False, default=str))]
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(_clip(str(block.get("text", ""))))
        elif kind in ("tool_use", "server_tool_use", "mcp_tool_use"):
            args = json.dumps(block.get("input"), ensure_ascii=False, default=str)
            parts.append(f"[tool call {block.get('name')} (id {block.get('id')})] {_clip(args)}")
        elif kind in ("tool_result", "mcp_tool_result"):
            label = "tool error" if block.get("is_error") else "tool result"
            inner = " ".join(_render_content(block.get("content", "")))
            parts.append(f"[{label} for {block.get('tool_use_id')}] {inner}")
        elif kind in ("thinking", "redacted_thinking"):
            continue  # private reasoning, not part of what was said
        else:
            parts.append(f"[{kind} block]")
    return parts


def render_transcript(messages: list[dict[str, Any]]) -> str:
    """``messages`` as plain text, one ``[role]`` section per message: text as
    it is, tool calls with their JSON input, tool results with their text,
    other blocks (images, documents) as a ``[<type> block]`` note; thinking
    left out; each block cut at :data:`TRANSCRIPT_BLOCK_CHARS`."""
    sections = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        body = "\n".join(p for p in _render_content(message.get("content")) if p)
        sections.append(f"[{message.get('role')}]\n{body}")
    return "\n\n".join(sections)


def summary_request_messages(older: list[dict[str, Any]], prompt: str | None) -> list[dict[str, Any]]:
    """The messages of the summary request: one user message holding the
    transcript of ``older`` and then the instruction (``prompt`` or
    :data:`DEFAULT_COMPACTION_PROMPT`)."""
    text = (
        "<conversation>\n"
        f"{render_transcript(older)}\n"
        "</conversation>\n\n"
        f"{prompt if prompt is not None else DEFAULT_COMPACTION_PROMPT}"
    )
    return [{"role": "user", "content": [{"type": "text", "text": text}]}]


def summary_text(reply: AssistantModelMessage) -> str:
    """The summary a reply carries (its text blocks joined). Raises
    :class:`CompactionError` when it has none."""
    content = reply.content if isinstance(reply.content, list) else []
    text = "".join(
        b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
    ).strip()
    if not text:
        raise CompactionError("the summary request returned no text")
    return text


def summary_message(summary: str) -> dict[str, Any]:
    """The user message that stands for the summarised part of the history."""
    return {"role": "user", "content": [{"type": "text", "text": SUMMARY_PREFIX + summary}]}


def compacted_history(history: list[dict[str, Any]], cut: int, summary: str) -> list[dict[str, Any]]:
    """``[summary message] + history[cut:]`` (the kept messages are the same objects).
    The tools ``tool_search`` loaded in the summarised part stay loaded: the
    summary message ends with a note naming them (:func:`~lattice_worker.tools.tool_search.loaded_note`)."""
    message = summary_message(summary)
    note = loaded_note(loaded_in_history(history[:cut]))
    if note is not None:
        message["content"].append(note)
    return [message, *history[cut:]]


__all__ = [
    "DEFAULT_COMPACTION_PROMPT",
    "SUMMARY_PREFIX",
    "TRANSCRIPT_BLOCK_CHARS",
    "Compaction",
    "CompactionError",
    "choose_cut",
    "compacted_history",
    "context_tokens",
    "is_overflow_error",
    "render_transcript",
    "summary_message",
    "summary_request_messages",
    "summary_text",
]
