"""A model request's size before it is sent, shared by the rate limits
(``runtime/limits``) and the run budgets (``runtime/run/budget.py``)."""

from __future__ import annotations

import json
from typing import Any


def estimate_input_tokens(request: Any) -> int:
    """A request's input tokens before it is sent: characters of its system
    prompt, messages and tools / 4 (at least 1); the response's usage corrects it."""
    parts = [
        getattr(request, "system", None),
        getattr(request, "messages", None),
        getattr(request, "tools", None),
    ]
    text = json.dumps(parts, ensure_ascii=False, default=str)
    return max(1, len(text) // 4)


__all__ = ["estimate_input_tokens"]
