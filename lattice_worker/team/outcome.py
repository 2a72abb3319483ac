"""How one work item ended: :class:`WorkItemOutcome` (what
:func:`~lattice_worker.team.work.run_work_item` returns and the distributed
runtime stores as JSON) and the ``ask`` tool-result text of an outcome.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from lattice_mailbox.message import TeamMessage


@dataclass
class WorkItemOutcome:
    """How one message ended.

    Attributes:
        message: the original message, with its final status.
        status: ``"done"`` (replied), ``"failed"``, ``"cancelled"`` (abort),
            ``"open"`` (the member sent only ``team_followup``: the message stays
            open in status ``read`` and can be closed later with ``team_reply``),
            or ``"parked"`` (a tool call waits for a person: the runtime's journal
            parked the message; the work item is not finished).
        content: the reply text, the last progress text, or the failure text.
        structured_result: the member's structured result (``submit_output`` /
            ``end_turn``), JSON-ready, or ``None``.
        error: the normalised failure (:class:`~lattice_worker.team.events.AgentRuntimeFailure`
            as a dict) for ``failed`` / ``cancelled``, else ``None``.
        report: the upstream message sent (reply, failure report or diagnostic), or ``None``.
    """

    message: TeamMessage
    status: str
    content: str
    structured_result: Any = None
    error: dict[str, Any] | None = None
    report: TeamMessage | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the distributed runtime stores outcomes as JSON)."""
        return {
            "message": self.message.to_json_dict(),
            "status": self.status,
            "content": self.content,
            "structured_result": self.structured_result,
            "error": self.error,
            "report": self.report.to_json_dict() if self.report is not None else None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkItemOutcome:
        """Inverse of :meth:`to_dict`."""
        report = data.get("report")
        return cls(
            message=TeamMessage.model_validate(data["message"]),
            status=data["status"],
            content=data.get("content") or "",
            structured_result=data.get("structured_result"),
            error=data.get("error"),
            report=TeamMessage.model_validate(report) if report else None,
        )


def outcome_tool_text(outcome: WorkItemOutcome) -> str:
    """The ``ask`` tool-result text of an outcome: the structured result as JSON
    when there is one, else the reply / failure text."""
    if outcome.status == "done" and outcome.structured_result is not None:
        return json.dumps(outcome.structured_result, ensure_ascii=False, default=str)
    return outcome.content


__all__ = ["WorkItemOutcome", "outcome_tool_text"]
