"""The user message that carries handoff reports back to the lead.

Spec: AgentLattice "Modes for calling a member" (after a batch with handoffs
the reports reach the lead in handoff order with their identifiers) and
"Handoff failure isolation" (the lead is resumed with successful and failed
reports alike). The distributed runtime builds the same message on resume, so
the lead sees one format whichever runtime ran its members.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from .ids import split_mailbox_id

if TYPE_CHECKING:
    from .work import WorkItemOutcome

REPORT_HEADER = (
    "Team handoff reports ({count}), in the order the work was handed off. "
    "Each report is JSON with the member, its message/work item/thread ids, the final status "
    "(done, failed, cancelled, or open when the member only sent progress) and the member's content "
    "or error. Decide what to do next: use the results, retry or revise a failed task, or finish."
)


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
    """The report entries of a message built by :func:`format_report_message`
    (for tests and tools that inspect a lead's history); ``[]`` for any other message."""
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


__all__ = ["REPORT_HEADER", "format_report_message", "parse_report_message", "report_entry"]
