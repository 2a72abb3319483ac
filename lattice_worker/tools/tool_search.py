"""Deferred tools and the ``tool_search`` tool that loads them (``docs/tool-effects.md``).

A tool made with ``defer=True`` is registered on the agent but not sent to the
model: the model sees only its name, listed in the description of a
``tool_search`` tool the agent adds while anything is deferred. A search loads
tools for the rest of the conversation; from the next model request on their
description and schema are sent like any other tool's.

``tool_search`` input: ``{"query": str, "limit"?: int}``. A query that names
only deferred tools (separated by commas or spaces) loads exactly those (at
most :data:`MAX_EXACT_NAMES`); any other query is a keyword search over the
deferred tools' names and descriptions, loading the best ``limit`` matches
(default :data:`DEFAULT_SEARCH_LIMIT`).

A load is recorded in the conversation history itself: the ``tool_search``
result is a JSON object whose ``"loaded"`` list names the tools it loaded, so
an agent rebuilt from a stored history (a resume in another process) knows
what is loaded (:func:`loaded_in_history`). Each load changes the tool list the
provider receives, which invalidates the provider's prompt cache once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..errors import ToolExecutionError
from .tool import ToolContext, ToolDefinition, content_text

TOOL_SEARCH_NAME = "tool_search"
MAX_EXACT_NAMES = 10
DEFAULT_SEARCH_LIMIT = 5
MAX_SEARCH_LIMIT = 10


class ToolSearchInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(
        description="Exact tool names separated by commas (loads exactly those), or keywords to search for."
    )
    limit: int = Field(
        default=DEFAULT_SEARCH_LIMIT,
        ge=1,
        le=MAX_SEARCH_LIMIT,
        description=f"How many keyword matches to load (default {DEFAULT_SEARCH_LIMIT}).",
    )


_WORD = re.compile(r"[a-z0-9]+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _name_words(name: str) -> set[str]:
    # "mcp__jira__createIssue" -> {"mcp", "jira", "create", "issue", "createissue"}
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return set(_words(spaced)) | set(_words(name))


def _score(tool: ToolDefinition, query_words: list[str]) -> int:
    name_words = _name_words(tool.name)
    description_words = set(_words(tool.description))
    score = 0
    for word in query_words:
        if word in name_words:
            score += 3
        elif any(w.startswith(word) for w in name_words):
            score += 2
        if word in description_words:
            score += 1
    return score


def search_deferred(deferred: list[ToolDefinition], query: str, limit: int) -> list[ToolDefinition]:
    """The tools ``query`` loads (module doc), in the order they were found.

    Raises :class:`ToolExecutionError` for an empty query, or more than
    :data:`MAX_EXACT_NAMES` exact names."""
    by_name = {t.name: t for t in deferred}
    tokens = [t for t in re.split(r"[,\s]+", query.strip()) if t]
    if not tokens:
        raise ToolExecutionError("tool_search needs a query: exact tool names or keywords")
    if all(t in by_name for t in tokens):
        names = list(dict.fromkeys(tokens))
        if len(names) > MAX_EXACT_NAMES:
            raise ToolExecutionError(
                f"tool_search loads at most {MAX_EXACT_NAMES} tools by name at once ({len(names)} given); "
                "split the names over several searches"
            )
        return [by_name[n] for n in names]
    words = _words(query)
    scored = [(score, i, t) for i, t in enumerate(deferred) if (score := _score(t, words)) > 0]
    scored.sort(key=lambda item: (-item[0], item[1]))
    return [t for _, _, t in scored[:limit]]


class DeferredTools:
    """The deferred tools of one agent and which of them are loaded.

    ``tools``: every registered tool (only the ``defer=True`` ones are kept).
    ``loaded`` is the set of loaded names; :meth:`note_history` adds the loads
    a history records; :attr:`search_tool` is the ``tool_search`` tool, or
    ``None`` while nothing is deferred.
    """

    def __init__(self, tools: Iterable[ToolDefinition]) -> None:
        self.deferred: dict[str, ToolDefinition] = {}
        self.loaded: set[str] = set()
        self.search_tool: ToolDefinition | None = None
        self.update(tools)

    def update(self, tools: Iterable[ToolDefinition]) -> None:
        """Re-read the registered tools (after ``add_tools``)."""
        self.deferred = {t.name: t for t in tools if t.defer}
        self.loaded &= set(self.deferred)
        self.search_tool = build_tool_search(list(self.deferred)) if self.deferred else None

    def is_hidden(self, name: str) -> bool:
        """True for a deferred tool that is not loaded yet."""
        return name in self.deferred and name not in self.loaded

    def visible(self, tools: Iterable[ToolDefinition]) -> list[ToolDefinition]:
        """``tools`` minus the deferred ones not loaded yet."""
        return [t for t in tools if not self.is_hidden(t.name)]

    def note_history(self, history: list[dict[str, Any]], *, replace: bool = False) -> None:
        """Take the loads recorded in ``history``; ``replace`` forgets the others first."""
        found = loaded_in_history(history) & set(self.deferred)
        self.loaded = found if replace else self.loaded | found

    def hidden_error(self, name: str) -> str:
        return (
            f'tool "{name}" is not loaded yet: call {TOOL_SEARCH_NAME} with query "{name}" to load it, '
            "then call it in your next response"
        )


def build_tool_search(names: list[str]) -> ToolDefinition:
    """The ``tool_search`` tool for the deferred tools ``names``; its handler
    loads into ``ctx.agent``'s :class:`DeferredTools`."""
    listing = ", ".join(names)
    description = (
        "Load tools that are available but not loaded yet, so you can call them. Pass their exact names "
        f"(comma separated, up to {MAX_EXACT_NAMES}) or keywords describing what you need. Loaded tools stay "
        f"available for the rest of the conversation. Tools you can load: {listing}"
    )

    async def handler(data: ToolSearchInput, ctx: ToolContext) -> str:  # (fast: stays on the loop)
        deferred = getattr(ctx.agent, "deferred_tools", None)
        if not isinstance(deferred, DeferredTools):
            raise ToolExecutionError("tool_search runs only inside an agent")
        found = search_deferred(list(deferred.deferred.values()), data.query, data.limit)
        for t in found:
            deferred.loaded.add(t.name)
        body: dict[str, Any] = {
            "loaded": [t.name for t in found],
            "tools": [{"name": t.name, "description": t.description} for t in found],
        }
        if not found:
            body["message"] = f"No tool matched {data.query!r}. Tools you can load: {listing}"
        else:
            body["message"] = "These tools are loaded: call them from your next response."
        return json.dumps(body, ensure_ascii=False)

    return ToolDefinition(
        name=TOOL_SEARCH_NAME,
        description=description,
        input_model=ToolSearchInput,
        handler=handler,
        effect="read_only",
        metadata={"tool_search": True},
    )


LOADED_NOTE_PREFIX = "[Tools loaded earlier in this conversation with tool_search: "
"""How a compacted history keeps the loads of the part it summarised: a text
block of its summary message, ``"<prefix>a, b]"`` (see :func:`loaded_note`)."""


def loaded_note(names: Iterable[str]) -> dict[str, Any] | None:
    """The text block recording ``names`` as loaded (``None`` for none): a compacted
    history keeps it in its summary message, so the loads survive the summary --
    in this process and in an agent rebuilt from the stored history elsewhere."""
    listed = sorted(set(names))
    return {"type": "text", "text": LOADED_NOTE_PREFIX + ", ".join(listed) + "]"} if listed else None


def loaded_in_history(history: list[dict[str, Any]]) -> set[str]:
    """Every tool name a successful ``tool_search`` result in ``history`` loaded,
    and those a compaction's note (:func:`loaded_note`) in a user message names."""
    search_ids: set[str] = set()
    loaded: set[str] = set()
    for message in history:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            text = block.get("text")
            if kind == "text" and message.get("role") == "user" and isinstance(text, str):
                if text.startswith(LOADED_NOTE_PREFIX) and text.endswith("]"):
                    names = text[len(LOADED_NOTE_PREFIX) : -1].split(", ")
                    loaded.update(n for n in names if n)
            elif kind == "tool_use" and block.get("name") == TOOL_SEARCH_NAME:
                search_ids.add(str(block.get("id")))
            elif (
                kind == "tool_result" and block.get("tool_use_id") in search_ids and not block.get("is_error")
            ):
                try:
                    body = json.loads(content_text(block.get("content")))
                except ValueError:
                    continue
                names = body.get("loaded") if isinstance(body, dict) else None
                if isinstance(names, list):
                    loaded.update(n for n in names if isinstance(n, str))
    return loaded


__all__ = [
    "DEFAULT_SEARCH_LIMIT",
    "MAX_EXACT_NAMES",
    "TOOL_SEARCH_NAME",
    "DeferredTools",
    "ToolSearchInput",
    "build_tool_search",
    "LOADED_NOTE_PREFIX",
    "loaded_in_history",
    "loaded_note",
    "search_deferred",
]
