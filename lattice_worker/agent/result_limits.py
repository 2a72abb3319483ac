"""Bounded tool results: one tool result never takes over the context window.

The agent option ``max_tool_result_chars`` (default
:data:`DEFAULT_MAX_TOOL_RESULT_CHARS`) bounds the text of every
``tool_result`` the loop records, after the ``on_tool_result`` hooks ran (so
the bound also holds for what a hook put there). A result whose text is
longer keeps its first ``max_tool_result_chars`` characters and gets a note
saying how many characters were left out. Non-text blocks (images,
documents) are kept as they are: the provider bounds those itself.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_TOOL_RESULT_CHARS = 100_000
"""Characters of text one tool result may carry (default of ``max_tool_result_chars``).

Why this number: today's context windows hold about 200,000 tokens (Claude;
several providers offer more), and text runs about 3-4 characters per token,
so 100,000 characters is roughly 25,000-33,000 tokens -- at most a sixth of
such a window for the largest single result. That leaves room for the
conversation, several big results and the model's answer, while a whole
source file, a long log tail or a large search result still fits uncut. A
5 MB result, which would break every later request of the conversation, is
cut to it."""


def _note(left_out: int, total: int) -> str:
    return (
        f"\n\n[... {left_out:,} of {total:,} characters of this tool result were left out: it was longer than "
        "the agent's max_tool_result_chars. Ask for a smaller part (a range, a filter, a summary) if you "
        "need more ...]"
    )


def bound_tool_result(block: dict[str, Any], limit: int | None) -> dict[str, Any]:
    """``block`` (a ``tool_result``) with its text cut to ``limit`` characters.

    ``limit``: a positive int, or ``None`` for no bound. A string content is
    cut to its first ``limit`` characters plus the note. A list content keeps
    its text blocks in order until ``limit`` characters are used, cuts the
    block where the budget ends, drops the text of the later ones and appends
    the note as one more text block; other blocks stay. Returns ``block``
    itself when it is within the bound (or has no text), else a new dict --
    the given one is never changed.
    """
    if limit is None:
        return block
    content = block.get("content")
    if isinstance(content, str):
        if len(content) <= limit:
            return block
        return {**block, "content": content[:limit] + _note(len(content) - limit, len(content))}
    if not isinstance(content, list):
        return block
    total = sum(
        len(b["text"])
        for b in content
        if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)
    )
    if total <= limit:
        return block
    budget = limit
    kept: list[Any] = []
    for item in content:
        if not (isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)):
            kept.append(item)
            continue
        text = item["text"]
        if budget <= 0:
            continue
        if len(text) > budget:
            kept.append({**item, "text": text[:budget]})
            budget = 0
        else:
            kept.append(item)
            budget -= len(text)
    kept.append({"type": "text", "text": _note(total - limit, total).lstrip("\n")})
    return {**block, "content": kept}


__all__ = ["DEFAULT_MAX_TOOL_RESULT_CHARS", "bound_tool_result"]
