"""Provider-safe tool names for MCP tools.

MCP servers name tools freely (``docs.search``, ``get weather``, 80-character
names); the Anthropic Messages API accepts only ``^[a-zA-Z0-9_-]{1,64}$``.
:func:`assign_tool_names` maps a server's names to names the model can call:

* every character outside ``[a-zA-Z0-9_-]`` becomes ``_``;
* a prefix is joined with ``_`` (``search`` with prefix ``docs`` is ``docs_search``);
* a name longer than 64 characters keeps its first 55 and gets ``_`` plus 8 hex
  characters of the SHA-256 of the server's name;
* two server names that map to the same name are told apart the same way: a
  name that needed no change keeps it, the others get the hash suffix.

The mapping is deterministic (the same listing always gives the same names) and
the tool adapter keeps the server's real name for the call.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

MAX_TOOL_NAME_LENGTH = 64
_HASH_LENGTH = 8
_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]")


def sanitize_name_part(part: str) -> str:
    """``part`` with every character outside ``[a-zA-Z0-9_-]`` replaced by ``_``
    (``""`` stays ``""``)."""
    return _UNSAFE.sub("_", part)


def _digest(text: str, salt: int = 0) -> str:
    data = text if salt == 0 else f"{text}\x00{salt}"
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:_HASH_LENGTH]


def _with_hash(base: str, original: str, salt: int = 0) -> str:
    keep = MAX_TOOL_NAME_LENGTH - _HASH_LENGTH - 1
    return f"{base[:keep]}_{_digest(original, salt)}"


def _candidate(name: str, prefix: str | None) -> str:
    body = sanitize_name_part(name) or "tool"
    return f"{sanitize_name_part(prefix)}_{body}" if prefix else body


def assign_tool_names(names: Sequence[str], *, prefix: str | None = None) -> list[str]:
    """Provider-safe, unique model-facing names for ``names`` (same order).

    ``prefix`` (for example the server's role, ``"docs"``) is sanitised the same
    way and joined with ``_``. Every returned name matches
    ``^[a-zA-Z0-9_-]{1,64}$`` and no two are equal. Duplicates in ``names``
    themselves also get distinct names (a server should not list one name twice).
    """
    candidates = [_candidate(n, prefix) for n in names]
    result: list[str | None] = [None] * len(names)
    taken: set[str] = set()
    # first pass: names that need no change and fit keep their name
    for i, (name, cand) in enumerate(zip(names, candidates, strict=True)):
        unchanged = cand == (f"{prefix}_{name}" if prefix else name)
        if unchanged and len(cand) <= MAX_TOOL_NAME_LENGTH and cand not in taken:
            result[i] = cand
            taken.add(cand)
    # second pass: the rest, in listing order
    for i, (name, cand) in enumerate(zip(names, candidates, strict=True)):
        if result[i] is not None:
            continue
        chosen = cand
        if len(chosen) > MAX_TOOL_NAME_LENGTH or chosen in taken:
            chosen = _with_hash(cand, name)
            salt = 0
            while chosen in taken:  # a hash collision, or the same server name listed twice
                salt += 1
                chosen = _with_hash(cand, name, salt)
        result[i] = chosen
        taken.add(chosen)
    return [r for r in result if r is not None]


__all__ = ["MAX_TOOL_NAME_LENGTH", "assign_tool_names", "sanitize_name_part"]
