"""Request normalisation: the messages of every model request obey the Messages API's rules.

The agent loop calls :func:`normalize_messages` on the messages of each request
it sends -- after the ``on_model_request`` hook, whatever the model, a hook or
a custom ``ModelClient`` put in the history -- so a request is never rejected
for its shape. The stored history is not changed; only the outgoing copy is.

Rules, applied in this order:

1. Text blocks that are empty or whitespace only are dropped (also inside a
   ``tool_result``'s content list); a message with no content left is dropped
   (a string content that is blank counts as none).
2. Consecutive messages of the same role are merged into one (a string
   content becomes one text block), so a report injected after the tool
   results joins their user turn.
3. In a user turn, ``tool_result`` blocks come first, in their order, then
   every other block in its order.
4. Every ``tool_use`` input is a JSON object (:func:`coerce_tool_input`).

``thinking`` and ``redacted_thinking`` blocks are never touched: the very
same dicts are passed on (their ``signature`` / ``data`` must reach the
provider byte for byte). Messages that need no change are passed on as the
same dict objects too, so a clean history costs one scan and no copies.
Only ``role`` and ``content`` of each message are kept when a message is
rebuilt; other keys of an untouched message are left as they are.
"""

from __future__ import annotations

import json
from typing import Any

from ..tools.tool_definition import _json_type_name

_TOOL_USE_TYPES = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})


def coerce_tool_input(value: Any) -> tuple[dict[str, Any], str | None]:
    """``(object input, problem)`` for a ``tool_use`` block's ``input``.

    A dict is returned as it is (problem ``None``); ``None`` or ``""`` is ``{}``
    (no input at all, no problem); a string holding a JSON object is that
    object (some providers send the input encoded). Anything else becomes
    ``{}`` with a one-line ``problem`` saying what was wrong (a string that is
    not valid JSON -- the parser's message and the first 200 characters --, or
    a JSON value that is not an object), for the loop to answer that call with
    an error result the model can fix.
    """
    if isinstance(value, dict):
        return value, None
    if value is None or value == "":
        return {}, None
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError as exc:
            excerpt = value if len(value) <= 200 else value[:200] + "..."
            return {}, f"the input is not valid JSON ({exc}): {excerpt}"
        if isinstance(parsed, dict):
            return parsed, None
        return {}, f"the input must be a JSON object, got {_json_type_name(parsed)}"
    return {}, f"the input must be a JSON object, got {_json_type_name(value)}"


def _blank_text(block: Any) -> bool:
    return (
        isinstance(block, dict)
        and block.get("type") == "text"
        and isinstance(block.get("text"), str)
        and not block["text"].strip()
    )


def _clean_tool_result(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if not isinstance(content, list) or not any(_blank_text(b) for b in content):
        return block
    kept = [b for b in content if not _blank_text(b)]
    out = {k: v for k, v in block.items() if k != "content"}
    if kept:
        out["content"] = kept
    return out


def _clean_block(block: Any) -> Any:
    """The block as it may be sent, or ``None`` to drop it."""
    if not isinstance(block, dict):
        return block
    kind = block.get("type")
    if kind == "text":
        return None if _blank_text(block) else block
    if kind in _TOOL_USE_TYPES:
        value = block.get("input")
        if isinstance(value, dict):
            return block
        fixed, _ = coerce_tool_input(value)
        return {**block, "input": fixed}
    if kind == "tool_result":
        return _clean_tool_result(block)
    return block  # thinking, redacted_thinking, image, document...: as they are


def _clean_content(content: Any) -> Any:
    """The content with rule 1 and 4 applied, or ``None`` when nothing is left."""
    if isinstance(content, str):
        return content if content.strip() else None
    if not isinstance(content, list):
        return content
    out = None
    for i, block in enumerate(content):
        cleaned = _clean_block(block)
        if cleaned is not block and out is None:
            out = list(content[:i])
        if out is not None and cleaned is not None:
            out.append(cleaned)
    if out is None:
        return content if content else None
    return out if out else None


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return list(content)
    return [content]


def _tool_results_first(content: list[Any]) -> list[Any] | None:
    """The reordered content when a non-``tool_result`` block precedes a
    ``tool_result`` one, else ``None``."""
    seen_other = False
    for block in content:
        is_result = isinstance(block, dict) and block.get("type") == "tool_result"
        if is_result and seen_other:
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            others = [b for b in content if not (isinstance(b, dict) and b.get("type") == "tool_result")]
            return results + others
        if not is_result:
            seen_other = True
    return None


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages of one request with the rules of the module doc applied.

    ``messages``: Anthropic wire-format message dicts (``{"role", "content"}``).
    Returns a new list; the given messages and their blocks are never mutated
    (changed messages are new dicts, unchanged ones the same objects).
    Entries that are not dicts with a ``role`` are passed on unchanged for the
    client to reject.
    """
    out: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            out.append(message)
            continue
        content = message.get("content")
        cleaned = _clean_content(content)
        if cleaned is None:
            continue
        role = message["role"]
        previous = out[-1] if out else None
        if isinstance(previous, dict) and previous.get("role") == role:
            out[-1] = {"role": role, "content": _as_blocks(previous.get("content")) + _as_blocks(cleaned)}
        elif cleaned is content:
            out.append(message)
        else:
            out.append({"role": role, "content": cleaned})
    for i, message in enumerate(out):
        if (
            isinstance(message, dict)
            and message.get("role") == "user"
            and isinstance(message.get("content"), list)
        ):
            reordered = _tool_results_first(message["content"])
            if reordered is not None:
                out[i] = {"role": "user", "content": reordered}
    return out


__all__ = ["coerce_tool_input", "normalize_messages"]
