"""What the operations page reads, through the same client the ``lattice`` command uses.

Every read goes through an :class:`~lattice_client.async_client.AsyncLatticeClient`
(its run store, mailbox and live registry): the page sees exactly what
``lattice status``, ``inbox``, ``parked`` and ``approvals`` see. Times are
milliseconds since the epoch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from lattice_mailbox import MessageStatus, TeamMessage

from ..celery_config import queue_name
from ..models import RunRecord, RunStatus
from ..registry import LiveRegistry, WorkerInfo
from ..runstore.records import as_text, now_ms
from .timeline import Timeline, build_timeline

EVENT_PAGE = 500
"""Events read per round trip when a run page is drawn."""

MAX_EVENTS_SHOWN = 5_000
"""A run page draws at most this many events (the newest are followed live)."""


@dataclass
class RunPage:
    """A run's page: its record, what its record keeps of the lead's lease
    (``lead_attempts``, ``lease_until_ms``), its items still registered, its
    waits (decided or not), the current state of each work item's message and
    the :class:`~lattice_client.ui.timeline.Timeline` of its events.

    ``facts`` are the rows of the run's summary table, ``(label, value)``: a
    later kind of fact (a budget, a rate-limit wait) is one more row."""

    record: RunRecord
    lead_attempts: int = 0
    lease_until_ms: int | None = None
    items: list[dict[str, Any]] = field(default_factory=list)
    waits: list[dict[str, Any]] = field(default_factory=list)
    messages: dict[str, TeamMessage] = field(default_factory=dict)
    timeline: Timeline = field(default_factory=Timeline)
    truncated: bool = False

    @property
    def finished(self) -> bool:
        return self.record.status.finished

    @property
    def facts(self) -> list[tuple[str, str]]:
        record = self.record
        rows = [
            ("team", record.team + (f" ({record.team_ref})" if record.team_ref else "")),
            ("status", record.status.value),
            ("created", fmt_time(record.created_at)),
            ("updated", fmt_time(record.updated_at)),
            ("lead starts since it last suspended", str(self.lead_attempts) if self.lead_attempts else "-"),
        ]
        if self.lease_until_ms:
            rows.append(("lead lease until", fmt_time(self.lease_until_ms)))
        if record.parent is not None:
            rows.append(("parent run", record.parent.run_id))
        if record.max_active is not None:
            rows.append(("max concurrent work items", str(record.max_active)))
        if record.budget_tokens is not None:
            spent = f"{record.spent_tokens or 0} / {record.budget_tokens}"
            if record.status.value == "budget_reached":  # parked: say how it goes on, as the calls page does
                spent += f" (parked until raised: lattice budget {record.run_id} --tokens N, the new total)"
            rows.append(("tokens spent / budget", spent))
        if record.result is not None and record.result.usage:
            rows.append(("usage", json.dumps(record.result.usage)))
        if record.metadata:
            rows.append(("metadata", json.dumps(record.metadata, ensure_ascii=False)))
        return rows


def fmt_time(ms: int | None) -> str:
    """``YYYY-MM-DD HH:MM:SS`` UTC of a millisecond timestamp (``-`` when unset)."""
    if not ms:
        return "-"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def fmt_age(ms: int | None, now: int | None = None) -> str:
    """How long ago ``ms`` was: ``42s``, ``3m 12s``, ``2h 5m``, ``4d 1h`` (``-`` when unset)."""
    if not ms:
        return "-"
    seconds = max(0, ((now or now_ms()) - ms) // 1000)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


async def list_runs(client: Any, team: str | None, status: str | None, limit: int) -> list[RunRecord]:
    """The ``limit`` most recent runs (of ``team``), newest first; with
    ``status``, those among the ``4 * limit`` most recent in that status."""
    if not status:
        return await client.runs.list_runs(team or None, limit=limit)
    wanted = RunStatus.parse(status)
    records = await client.runs.list_runs(team or None, limit=limit * 4)
    return [r for r in records if r.status == wanted][:limit]


async def run_page(client: Any, run_id: str) -> RunPage | None:
    """The :class:`RunPage` of ``run_id``, or ``None`` for an unknown run."""
    runs = client.runs
    record = await runs.get(run_id)
    if record is None:
        return None
    redis = await runs.redis()
    attempts, lease_until = await redis.hmget(runs.keys(run_id).record, ["lead_attempts", "lease_until"])
    page = RunPage(record=record)
    page.lead_attempts = int(as_text(attempts)) if attempts else 0
    if lease_until and record.status == RunStatus.RUNNING:
        page.lease_until_ms = int(as_text(lease_until))
    page.items = await runs.items(run_id)
    entries: list[tuple[str, dict[str, Any]]] = []
    last = "0-0"
    while len(entries) < MAX_EVENTS_SHOWN:
        batch = await runs.events(run_id, last, count=EVENT_PAGE)
        if not batch:
            break
        entries += batch
        last = batch[-1][0]
    page.truncated = len(entries) >= MAX_EVENTS_SHOWN
    workers = await client.live_workers()
    page.timeline = build_timeline(entries, workers)
    stored = [json.loads(as_text(v)) for v in (await redis.hgetall(runs.waits_key(run_id))).values()]
    page.waits = run_waits(entries, stored)
    for step in page.timeline.steps:
        message = await client.mailbox.get(step.message_id)
        if message is not None:
            page.messages[step.message_id] = message
    return page


def run_waits(
    entries: list[tuple[str, dict[str, Any]]], stored: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The calls of a run that waited for a person, oldest first: each
    ``tool_parked`` / ``approval_pending`` event of its stream, with the wait
    the run store still keeps (``resolution`` once decided; a member's decided
    wait is dropped at its next claim, a lead's when decided). ``state``:
    ``waiting``, ``decided`` (with ``resolution``) or ``gone`` (decided, and
    the work went on)."""
    kinds = {"tool_parked": "parked", "approval_pending": "approval"}
    seen: dict[str, dict[str, Any]] = {}
    for _, event in entries:
        if event.get("type") in kinds and event.get("id"):
            seen[str(event["id"])] = {**event, "kind": kinds[str(event["type"])], "resolution": None}
    for wait in stored:
        seen[str(wait.get("id"))] = {**seen.get(str(wait.get("id")), {}), **wait}
    out = []
    for wait in sorted(seen.values(), key=lambda w: int(w.get("created_at") or 0)):
        stored_now = any(str(w.get("id")) == str(wait.get("id")) for w in stored)
        state = "decided" if wait.get("resolution") else ("waiting" if stored_now else "gone")
        out.append({**wait, "state": state})
    return out


@dataclass
class MailboxRow:
    """One mailbox: its id, message counts by status and the oldest pending message's time."""

    mailbox_id: str
    counts: dict[str, int]
    oldest_pending_ms: int | None = None

    @property
    def team(self) -> str:
        return self.mailbox_id.partition("::")[0]

    @property
    def member(self) -> str:
        return self.mailbox_id.partition("::")[2]


async def mailboxes(client: Any, team: str | None) -> list[MailboxRow]:
    """Every mailbox (of ``team``) with its counts and oldest pending message."""
    rows = []
    for mailbox_id in await client.known_mailboxes(team or None):
        counts = await client.mailbox.counts(mailbox_id)
        oldest = None
        if counts.get("pending"):
            pending = await client.mailbox.inbox(mailbox_id, MessageStatus.PENDING)
            oldest = min((m.created_at for m in pending), default=None)
        rows.append(MailboxRow(mailbox_id, dict(counts), oldest))
    return rows


@dataclass
class WaitingCall:
    """A parked call or a pending approval with what else is known of it:
    the wait as stored (``effect_key``, ``work_item_id``...), the tool
    journal's record of the call (``status`` ``started`` and ``started_at_ms``
    for a call a crash interrupted) and the member's message."""

    kind: str
    call: Any
    wait: dict[str, Any]
    journal: dict[str, Any] | None = None
    message: TeamMessage | None = None

    @property
    def call_id(self) -> str:
        """The id to decide it with: a parked call's ``message_id``, an approval's ``call_id``."""
        return str(self.call.message_id if self.kind == "parked" else self.call.call_id)


async def waiting_calls(client: Any, team: str | None) -> tuple[list[WaitingCall], list[WaitingCall]]:
    """``(parked calls, pending approvals)`` (of ``team``), oldest first, each a :class:`WaitingCall`."""
    runs = client.runs
    redis = await runs.redis()

    async def known(kind: str, call: Any, wait_id: str) -> WaitingCall:
        wait = await runs.get_wait(call.run_id, wait_id) or {}
        item = wait.get("work_item_id")
        key = runs.item_journal_key(call.run_id, item) if item else runs.tools_key(call.run_id)
        raw = await redis.hget(key, call.tool_use_id)
        journal = json.loads(as_text(raw)) if raw else None
        message = await client.mailbox.get(wait["message_id"]) if wait.get("message_id") else None
        return WaitingCall(kind, call, wait, journal if isinstance(journal, dict) else None, message)

    parked = [await known("parked", c, c.message_id) for c in await client.parked(team or None)]
    approvals = [await known("approval", c, c.call_id) for c in await client.approvals(team or None)]
    return parked, approvals


@dataclass
class QueueRow:
    """One Celery queue: the live workers consuming it (none: shown in red)."""

    queue: str
    workers: list[WorkerInfo]


async def workers_and_queues(client: Any) -> tuple[list[WorkerInfo], list[QueueRow]]:
    """The live workers, and every queue some live worker consumes or some known
    team needs (its lead's and one per mailbox it has), with its consumers."""
    workers = await client.live_workers()
    by_queue = LiveRegistry(workers).by_queue()
    prefix = client.settings.key_prefix
    for mailbox_id in await client.known_mailboxes():
        team, _, member = mailbox_id.partition("::")
        for name in ("lead", member):
            try:
                by_queue.setdefault(queue_name(prefix, team, name), [])
            except ValueError:  # a mailbox id no queue can be named after
                continue
    for team in await client.known_teams():
        by_queue.setdefault(queue_name(prefix, team, "lead"), [])
    return workers, [QueueRow(q, by_queue[q]) for q in sorted(by_queue)]


__all__ = [
    "MAX_EVENTS_SHOWN",
    "MailboxRow",
    "QueueRow",
    "RunPage",
    "WaitingCall",
    "fmt_age",
    "fmt_time",
    "list_runs",
    "mailboxes",
    "run_page",
    "run_waits",
    "waiting_calls",
    "workers_and_queues",
]
