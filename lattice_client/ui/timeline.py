"""A run's timeline for the operations page, built from what the run store keeps.

Pure functions of a run's event stream (``[(stream entry id, event dict)]``,
as :meth:`~lattice_client.runstore.RunStore.events` returns them) and the
live workers: nothing here reads Redis.

* :class:`EventRow` - one event as a line of the page: its stream id, its time
  (milliseconds since the epoch, from the stream id), who emitted it (``lead``
  or a member), its kind and a one-line summary. Unknown event types (a newer
  worker's) are shown with their JSON, so new kinds appear without a change here.
* :class:`Segment` - one lead segment: a lead turn from its ``system init``
  event to the status it ended in (``suspended``, ``parked``, ``completed``...).
* :class:`MemberStep` - one member work item: the task the lead sent, each
  claim of it (:class:`Attempt`: which worker, its lease, its outcome) and how
  it ended.

A claim's ``claimed_by`` is ``<host>:<pid>:<random>`` (``drain:...`` for
``lattice drain``); :func:`worker_label` names the live worker it belongs to
(``WorkerInfo.hostname`` and ``pid``), or says the process is not live now.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..registry import WorkerInfo

SUMMARY_CHARS = 240
"""Longest one-line summary of an event (characters)."""

LEAD_ENDS = ("suspended", "parked", "awaiting_approval", "budget_reached")
"""``run_status`` values that end a lead segment without ending the run."""


def entry_ms(entry_id: str) -> int:
    """The time (ms since the epoch) of a Redis stream entry id ``<ms>-<seq>`` (0 if malformed)."""
    head = str(entry_id).partition("-")[0]
    return int(head) if head.isdigit() else 0


def one_line(value: Any, limit: int = SUMMARY_CHARS) -> str:
    """``value`` (a string, or anything JSON can show) on one line, at most ``limit`` characters."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _content_text(content: Any) -> str:
    # an Anthropic content list, shown as text / tool_use / tool_result parts
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            parts.append(f"calls {block.get('name')}({one_line(block.get('input'), 120)})")
        elif kind == "tool_result":
            error = "error " if block.get("is_error") else ""
            parts.append(
                f"{error}result of {block.get('tool_use_id')}: {_content_text(block.get('content'))}"
            )
    return " ".join(parts)


def summarize(event: dict[str, Any]) -> tuple[str, str, str]:
    """``(source, kind, summary)`` of one run event: ``source`` is ``lead`` or
    the member that emitted it (``team::member`` for a nested team's), ``kind``
    its ``type`` (with the ``subtype``), ``summary`` one line of what it says."""
    source = "lead"
    depth = 0
    while event.get("type") == "agent_message" and isinstance(event.get("message"), dict) and depth < 16:
        source = str(event.get("member") or source) if depth == 0 else f"{source}/{event.get('member')}"
        event = event["message"]
        depth += 1
    kind = str(event.get("type", "?"))
    subtype = event.get("subtype")
    label = f"{kind}:{subtype}" if subtype else kind
    message = event.get("message") if isinstance(event.get("message"), dict) else {}
    if depth == 0 and event.get("member") and kind != "run_status":
        source = str(event["member"])
    elif depth == 0 and kind == "team_message":
        box = (
            message.get("to")
            if subtype in ("claimed", "done", "failed", "cancelled", "read")
            else message.get("from")
        )
        source = str(box or "").rpartition("::")[2] or source
    if kind == "system" and subtype == "init":
        text = f"{event.get('name') or source} starts a turn"
    elif kind in ("assistant", "user"):
        text = _content_text(message.get("content"))
    elif kind == "result":
        text = f"{subtype}: {event.get('result') or event.get('error') or ''}"
    elif kind == "team_message":
        text = f"{message.get('from')} → {message.get('to')}: {message.get('content', '')}"
        if subtype == "claimed" and message.get("claimed_by"):
            text = f"claimed by {message.get('claimed_by')} (attempt {message.get('attempts')}): " + text
    elif kind == "team_agent":
        text = f"{event.get('member')} {subtype}" + (
            f" ({event.get('result')})" if event.get("result") else ""
        )
    elif kind == "run_status":
        text = str(event.get("status"))
        if event.get("attempt") is not None:
            text += f" (attempt {event.get('attempt')})"
        if event.get("wait_id"):
            text += f" on {event.get('wait_id')}"
    elif kind == "lead_segment":
        text = f"the lead's segment starts on {event.get('worker')} (attempt {event.get('attempt')})"
    elif kind in ("tool_parked", "approval_pending"):
        text = f"{event.get('tool_name')} ({event.get('effect')}) waits as {event.get('id')}: {event.get('reason')}"
    elif kind == "run_result":
        text = f"{event.get('status')}: {event.get('result') or event.get('error') or ''}"
    else:  # a kind this page does not know yet: its fields as JSON
        text = json.dumps({k: v for k, v in event.items() if k != "type"}, ensure_ascii=False, default=str)
    return source, label, one_line(text)


@dataclass
class EventRow:
    """One event as a line of the run page (see the module doc); ``final``: the ``run_result``."""

    entry_id: str
    at_ms: int
    source: str
    kind: str
    summary: str
    final: bool = False

    def to_json(self) -> dict[str, Any]:
        """What the page's live script receives for a new event."""
        return {
            "id": self.entry_id,
            "at_ms": self.at_ms,
            "source": self.source,
            "kind": self.kind,
            "summary": self.summary,
            "final": self.final,
        }


def event_row(entry_id: str, event: dict[str, Any]) -> EventRow:
    """The :class:`EventRow` of one stream entry."""
    source, kind, summary = summarize(event)
    return EventRow(entry_id, entry_ms(entry_id), source, kind, summary, event.get("type") == "run_result")


@dataclass
class Segment:
    """One lead segment: ``number`` (1-based), when it started and ended (ms),
    how it ended (``end``: a ``run_status`` value, ``completed`` / ``failed`` /
    ``cancelled``, or ``running`` while it goes on), the tools it called and
    the recovery attempt that started it (``None``: not a recovery);
    ``claimed_by`` the process that ran it (its ``lead_segment`` event; ``""``
    for a run of a worker older than that event) and ``worker``
    (:func:`worker_label` of it)."""

    number: int
    started_ms: int
    ended_ms: int | None = None
    end: str = "running"
    turns: int = 0
    tool_calls: list[str] = field(default_factory=list)
    recovery_attempt: int | None = None
    claimed_by: str = ""
    worker: str = "-"


@dataclass
class Attempt:
    """One claim of a work item's message: ``number`` (the message's
    ``attempts`` then), ``claimed_by`` (the process id it recorded), ``worker``
    (:func:`worker_label`), ``claimed_ms``, ``lease_until_ms`` (the lease it
    got), ``ended_ms`` / ``result`` once the member's step ended."""

    number: int
    claimed_by: str
    worker: str
    claimed_ms: int
    lease_until_ms: int | None = None
    ended_ms: int | None = None
    result: str | None = None


@dataclass
class MemberStep:
    """One member work item of the run: ``member`` (its mailbox ``team::member``),
    the ``message_id`` and ``task`` the lead sent, its ``mode`` (ask / handoff),
    each claim (:attr:`attempts`) and its ``status`` (``sent``, ``claimed``,
    ``done``, ``failed``, ``cancelled``, ``parked``...) with the ``reply`` text."""

    work_item_id: str
    member: str
    message_id: str
    task: str
    mode: str = ""
    sent_ms: int = 0
    status: str = "sent"
    reply: str | None = None
    attempts: list[Attempt] = field(default_factory=list)


def worker_label(claimed_by: str | None, workers: Sequence[WorkerInfo]) -> str:
    """The worker a claim's ``claimed_by`` (``<host>:<pid>:<random>``) names:
    the node of the live worker on that host with that process id, else
    ``"<host> pid <pid> (not a live worker now)"``; ``lattice drain (...)`` for a drain."""
    if not claimed_by:
        return "-"
    text = str(claimed_by)
    drained = text.startswith("drain:")
    host, _, rest = text.removeprefix("drain:").partition(":")
    pid = rest.partition(":")[0]
    if drained:
        return f"lattice drain on {host} (pid {pid})"
    for worker in workers:
        if worker.hostname == host and str(worker.pid) == pid:
            return worker.node
    return f"{host} pid {pid} (not a live worker now)"


@dataclass
class Timeline:
    """Everything the run page draws from the events (see the module doc)."""

    rows: list[EventRow] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    steps: list[MemberStep] = field(default_factory=list)

    @property
    def last_id(self) -> str:
        """The stream id of the last event (``0-0`` when there is none): where the live script resumes."""
        return self.rows[-1].entry_id if self.rows else "0-0"


def _lead_segment_event(
    segments: list[Segment],
    event: dict[str, Any],
    at: int,
    recovery: int | None,
    on: tuple[str, str] = ("", "-"),
) -> None:
    # on: (claimed_by, worker label) of the last lead_segment event
    kind = event.get("type")
    if kind == "system" and event.get("subtype") == "init":
        segments.append(
            Segment(len(segments) + 1, at, recovery_attempt=recovery, claimed_by=on[0], worker=on[1])
        )
        return
    if not segments:
        return
    current = segments[-1]
    if kind == "assistant":
        current.turns += 1
        content = (event.get("message") or {}).get("content") or []
        current.tool_calls += [
            str(b.get("name")) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
    elif kind == "run_status" and event.get("status") in LEAD_ENDS and current.end == "running":
        current.end, current.ended_ms = str(event.get("status")), at
    elif kind == "run_result" and current.end == "running":
        current.end, current.ended_ms = str(event.get("status")), at


def _step_event(
    steps: dict[str, MemberStep], event: dict[str, Any], at: int, workers: Sequence[WorkerInfo]
) -> None:
    kind, subtype = event.get("type"), event.get("subtype")
    if kind == "team_message":
        message = event.get("message") or {}
        item = message.get("work_item_id")
        if not item:
            return
        meta = message.get("metadata") or {}
        step = steps.get(item)
        if subtype == "sent" and meta.get("kind", "task") == "task" and step is None:
            steps[item] = MemberStep(
                work_item_id=item,
                member=str(message.get("to")),
                message_id=str(message.get("id")),
                task=str(message.get("content", "")),
                mode=str(meta.get("mode") or ""),
                sent_ms=at,
            )
            return
        if step is None:
            return
        if subtype == "claimed" and message.get("id") == step.message_id:
            claimed_by = str(message.get("claimed_by") or "")
            step.attempts.append(
                Attempt(
                    number=int(message.get("attempts") or len(step.attempts) + 1),
                    claimed_by=claimed_by,
                    worker=worker_label(claimed_by, workers),
                    claimed_ms=at,
                    lease_until_ms=message.get("lease_until"),
                )
            )
            step.status = "claimed"
        elif subtype in ("reply", "followup") and message.get("to") != step.member:
            step.reply = str(message.get("content", ""))
        elif subtype in ("done", "failed", "cancelled", "read") and message.get("id") == step.message_id:
            step.status = str(subtype)
    elif kind == "team_agent":
        step = steps.get(str(event.get("work_item_id")))
        if step is None or not step.attempts:
            return
        if subtype == "end":
            step.attempts[-1].ended_ms, step.attempts[-1].result = at, str(event.get("result") or "")
    elif kind in ("tool_parked", "approval_pending"):
        step = steps.get(str(event.get("work_item_id")))
        if step is not None:
            step.status = "parked" if kind == "tool_parked" else "awaiting approval"


def build_timeline(
    entries: Iterable[tuple[str, dict[str, Any]]], workers: Sequence[WorkerInfo] = ()
) -> Timeline:
    """The :class:`Timeline` of a run's events (oldest first). A member's
    events reach its run's stream unwrapped (its ``team_message`` and
    ``team_agent`` events) and wrapped (``agent_message``: its own turns);
    lead segments are the lead's own ``system init`` events onward, each on
    the worker its ``lead_segment`` event (emitted just before) names."""
    timeline = Timeline()
    steps: dict[str, MemberStep] = {}
    recovery: int | None = None
    on: tuple[str, str] = ("", "-")  # the worker of the segment that starts next
    for entry_id, event in entries:
        row = event_row(entry_id, event)
        timeline.rows.append(row)
        if event.get("type") == "lead_segment":
            claimed_by = str(event.get("worker") or "")
            on = (claimed_by, worker_label(claimed_by, workers))
            continue
        if event.get("type") == "run_status" and event.get("status") == "recovering":
            recovery = event.get("attempt")
            if timeline.segments and timeline.segments[-1].end == "running":
                timeline.segments[-1].end, timeline.segments[-1].ended_ms = "lease expired", row.at_ms
            continue
        if event.get("type") == "agent_message":
            continue
        _lead_segment_event(timeline.segments, event, row.at_ms, recovery, on)
        if event.get("type") == "system":
            recovery, on = None, ("", "-")
        _step_event(steps, event, row.at_ms, workers)
    timeline.steps = list(steps.values())
    return timeline


__all__ = [
    "Attempt",
    "EventRow",
    "LEAD_ENDS",
    "MemberStep",
    "SUMMARY_CHARS",
    "Segment",
    "Timeline",
    "build_timeline",
    "entry_ms",
    "event_row",
    "one_line",
    "summarize",
    "worker_label",
]
