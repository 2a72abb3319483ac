"""Reports of member work: the user message that carries handoff reports back
to the lead, and what the team's caller gets about them.

After a batch with handoffs the reports reach the lead in handoff order with
their identifiers, and the lead is resumed with successful and failed reports
alike (docs/architecture.md, "Teams in one process"). The distributed runtime
builds the same message on resume, so
the lead sees one format whichever runtime ran its members.

The caller sees failed work items too, not only the lead: a team query ends
with a :class:`TeamResultMessage` whose ``failed_work_items`` names each
member whose work item failed or was cancelled -- typically a member that
answered without calling ``team_reply`` (code ``no_reply``) -- and the
distributed runtime's ``RunResult.failed_work_items`` carries the same
entries (read back from the lead's history by :func:`failed_work_items`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import Field

from ..agent.events import ResultMessage
from .events import FAILURE_TEXT, failure_text
from .ids import split_mailbox_id

if TYPE_CHECKING:
    from .work import WorkItemOutcome

REPORT_HEADER = (
    "Team handoff reports ({count}), in the order the work was handed off. "
    "Each report is JSON with the member, its message/work item/thread ids, the final status "
    "(done, failed, cancelled, or open when the member only sent progress) and the member's content "
    "or error. Decide what to do next: use the results, retry or revise a failed task, or finish."
)


FAILED_STATUSES = frozenset({"failed", "cancelled"})
"""Work item statuses that count as failed for the caller."""


def report_entry(outcome: WorkItemOutcome) -> dict[str, Any]:
    """One report as a JSON-ready dict: ``member``, ``message_id``,
    ``work_item_id``, ``thread_id``, ``status``, ``content`` and, when present,
    ``structured_result``, ``error`` (normalised failure) and ``report_message_id``
    (the upstream reply / failure report)."""
    message = outcome.message
    try:
        member = split_mailbox_id(message.to)[1]
    except ValueError:
        member = message.to
    entry: dict[str, Any] = {
        "member": member,
        "message_id": message.id,
        "work_item_id": message.work_item_id,
        "thread_id": message.thread_id,
        "status": outcome.status,
        "content": outcome.content,
    }
    if outcome.structured_result is not None:
        entry["structured_result"] = outcome.structured_result
    if outcome.error is not None:
        entry["error"] = outcome.error
    if outcome.report is not None:
        entry["report_message_id"] = outcome.report.id
    return entry


def format_report_message(outcomes: list[WorkItemOutcome]) -> dict[str, Any]:
    """The Anthropic wire-format user message carrying ``outcomes`` to the lead.

    ``{"role": "user", "content": [header text block, one text block per
    outcome holding its :func:`report_entry` as JSON]}``, in the order given
    (the runtime passes handoff order). Raises ``ValueError`` for an empty list:
    a batch without handoffs adds no message.
    """
    if not outcomes:
        raise ValueError("format_report_message: no outcomes to report")
    blocks: list[dict[str, Any]] = [{"type": "text", "text": REPORT_HEADER.format(count=len(outcomes))}]
    for outcome in outcomes:
        blocks.append(
            {
                "type": "text",
                "text": json.dumps(report_entry(outcome), ensure_ascii=False, default=str),
            }
        )
    return {"role": "user", "content": blocks}


def parse_report_message(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The report entries of a handoff report message (the user message a lead
    gets after a batch of handoffs, built by :func:`format_report_message`), for
    code that reads a lead's history (``await team.lead.get_history()``).

    Each entry is a dict: ``member``, ``message_id``, ``work_item_id``,
    ``thread_id``, ``status`` (``done`` / ``failed`` / ``cancelled`` / ``open``),
    ``content`` (the reply, or the failure text) and, when present,
    ``structured_result``, ``error`` (``{"code", "message", ...}``) and
    ``report_message_id``. ``[]`` for any other message; never raises on a
    message of another shape."""
    content = message.get("content")
    if not isinstance(content, list) or not content:
        return []
    # the header may follow tool_result blocks: a request merges the report into the results' turn
    start = next(
        (
            i
            for i, b in enumerate(content)
            if isinstance(b, dict) and str(b.get("text", "")).startswith("Team handoff reports")
        ),
        None,
    )
    if start is None:
        return []
    entries = []
    for block in content[start + 1 :]:
        try:
            entries.append(json.loads(block["text"]))
        except (KeyError, TypeError, ValueError):
            continue
    return entries


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(b.get("text", "")) for b in content if isinstance(b, dict))
    return ""


def failed_work_items(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The failed or cancelled work items a lead's ``history`` reports, in order:
    the handoff report entries with such a status (as :func:`parse_report_message`
    gives them) and the ``ask`` calls whose error names a failed work item
    (``member``, ``work_item_id``, ``status: "failed"``, ``content``, ``error``
    with its ``code`` and ``message``)."""
    found: list[dict[str, Any]] = []
    for message in history:
        if not isinstance(message, dict) or message.get("role") != "user":
            continue
        found += [e for e in parse_report_message(message) if e.get("status") in FAILED_STATUSES]
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if not (isinstance(block, dict) and block.get("type") == "tool_result" and block.get("is_error")):
                continue
            text = _tool_result_text(block)
            match = FAILURE_TEXT.search(text)
            if match is None:
                continue
            work_item_id, member, code, detail = match.groups()
            found.append(
                {
                    "member": member,
                    "work_item_id": work_item_id,
                    "status": "failed",
                    "content": text.removeprefix("Error: "),
                    "error": {"code": code, "message": detail},
                }
            )
    return found


class TeamResultMessage(ResultMessage):
    """The final event of a team query (``Team.query`` / ``Team.prompt``): the
    lead's :class:`~lattice_worker.agent.events.ResultMessage` plus the work
    items of this query.

    ``work_items``: one :func:`report_entry` dict per work item the lead handed
    out in this query (``ask`` and ``handoff``), in the order it handed them out.
    ``failed_work_items``: those that failed or were cancelled -- e.g. a member
    that ended without ``team_reply`` (``error["code"] == "no_reply"``). The
    lead saw them too and decided; ``subtype`` stays the lead's own.
    """

    work_items: list[dict[str, Any]] = Field(default_factory=list)
    failed_work_items: list[dict[str, Any]] = Field(default_factory=list)

    @classmethod
    def of(cls, result: ResultMessage, outcomes: list[WorkItemOutcome]) -> TeamResultMessage:
        """``result`` with the entries of ``outcomes``."""
        entries = [report_entry(o) for o in outcomes]
        return cls(
            **result.model_dump(exclude={"type"}),
            exception=result.exception,
            work_items=entries,
            failed_work_items=[e for e in entries if e["status"] in FAILED_STATUSES],
        )


__all__ = [
    "FAILED_STATUSES",
    "REPORT_HEADER",
    "TeamResultMessage",
    "failed_work_items",
    "failure_text",
    "format_report_message",
    "parse_report_message",
    "report_entry",
]
