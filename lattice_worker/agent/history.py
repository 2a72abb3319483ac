"""The ``HistoryStore`` protocol: durable storage of one Agent's conversation.

``load()`` runs once per
Agent lifetime before the first query; ``append(message)`` follows every
message added to the history; ``replace(messages)`` follows wholesale rewrites
(``replace_history``, compaction). Messages are Anthropic wire-format dicts.
``fail_on_error`` (attribute) is bound by the factory; when false, the agent
loop logs store errors and continues in memory.

Implementations live in :mod:`lattice_worker.agent.history_stores`.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class HistoryStore(Protocol):
    """Methods may be sync or async; the loop awaits whatever they return."""

    def load(self) -> Any: ...

    def append(self, message: dict[str, Any]) -> Any: ...

    def replace(self, messages: list[dict[str, Any]]) -> Any: ...


__all__ = ["HistoryStore"]
