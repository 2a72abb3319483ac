"""``SuspendQuery``: how a runtime stops a query without an error (docs/contracts.md)."""

from __future__ import annotations


class SuspendQuery(Exception):  # noqa: N818 - the name is the contract (docs/contracts.md)
    """Raised by a query ``runtime`` to stop the query without an error: it ends
    with a ``result`` of subtype ``"suspended"`` (``is_error`` false) and the
    history intact, ready to be continued. Only the distributed runtime uses it.

    Raised from ``after_tool_batch``, the history ends with the batch's
    ``tool_result`` message (continue with ``Agent.query(None)``). Raised while a
    tool call waits -- by ``runtime.approve_tool_call`` (an approval) or by the
    ``tool_journal``'s ``park`` -- the batch stops where it is: no
    ``tool_result`` message is recorded, the history ends with the assistant
    turn, and the calls already done are in the runtime's journal.
    ``reason`` is free text for logs."""

    def __init__(self, reason: str = "suspended") -> None:
        super().__init__(reason)
        self.reason = reason


__all__ = ["SuspendQuery"]
