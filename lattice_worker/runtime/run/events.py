"""The event emitter: a step's run events, queued on the run writer.

:meth:`EventEmitter.emit` encodes an SDK / team event once and queues it for
the run's event stream (:meth:`~lattice_worker.runtime.run.writer.RunWriter.queue_events`);
for a child run (a nested team) also for every ancestor's stream, wrapped as
``agent_message`` of the member the child run serves. Token-level
``stream_event`` events (also wrapped ones) are not stored: they would
multiply the stream's size for no reader's benefit. Failures are logged,
never raised (events are observational).

Fencing: a step that holds a run -- a lead segment under its lease, a member
under its claim on a work item -- sets :data:`current_fence` (an
:class:`~lattice_client.runstore.EventFence`: ``RunStore.lead_events_fence`` /
``item_events_fence``) for the code that emits its events; those of that run
are then appended only while the fence holds, checked in the same script call
(``append_events_fenced.lua``): a worker that lost its lease or claim writes
nothing to the run's stream. The copies into an ancestor's stream are not
fenced (another run's keys: one script cannot check both on Redis Cluster),
nor are the events a step emits after it ended its hold itself (a lead
segment once it suspended or parked a call: its ``tool_parked`` and
``run_status`` events) or the reaper's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from lattice_client.runstore import EventFence, RunStore

from .writer import RunWriter

logger = logging.getLogger("lattice_worker.runtime")

FenceSource = EventFence | Callable[[], EventFence | None]
"""A fence, or a function giving the fence in force now (``None``: none)."""

current_fence: ContextVar[FenceSource | None] = ContextVar("lattice_event_fence", default=None)
"""The fence of the events emitted in this context (see the module doc), or ``None``."""

MAX_NESTING = 16
"""How many ancestors a child run's events are copied to at most."""


class EventEmitter:
    """Queues run events on ``writer`` (see the module doc); ``runs`` names the
    streams and tells a child run's parent."""

    def __init__(self, runs: RunStore, writer: RunWriter) -> None:
        self.runs = runs
        self.writer = writer
        self._parents: dict[str, tuple[str, str, str] | None] = {}

    async def emit(self, run_id: str, event: Any, *, fence: EventFence | None = None) -> None:
        """Queue ``event`` (an SDK/team event model or a dict) for run ``run_id``'s
        stream and its ancestors' (see the module doc); written with the
        writer's next batch (:meth:`RunWriter.flush` waits for it). ``fence``
        (default :data:`current_fence`) applies when it is ``run_id``'s."""
        if fence is None:
            source = current_fence.get()
            fence = source() if callable(source) else source
        if fence is not None and fence.run_id != run_id:
            fence = None
        data: dict[str, Any] | None = None
        payload = _model_json(event)  # a model's JSON straight from pydantic: the same text
        if payload is None:
            data = _event_dict(event)
            if _is_stream_delta(data):
                return
        elif payload == "":  # a token-level stream event
            return
        current = run_id
        depth = 0
        while current and depth < MAX_NESTING:
            try:
                if payload is None:
                    assert data is not None
                    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
                keys = self.runs.keys(current)
            except ValueError:
                logger.warning(
                    "could not queue a %s event for run %s",
                    getattr(event, "type", None),
                    current,
                    exc_info=True,
                )
                return
            self.writer.queue_events(keys.record, keys.events, payload, fence if depth == 0 else None)
            try:
                parent = await self._parent_of(current)
            except Exception:
                logger.warning("could not read the parent of run %s", current, exc_info=True)
                parent = None
            if parent is None:
                break
            parent_run, parent_team, member = parent
            if data is None:
                data = _event_dict(event)
            payload = None
            data = {
                "type": "agent_message",
                "team": parent_team,
                "member": member,
                "mailbox": f"{parent_team}::{member}",
                "message": data,
            }
            current = parent_run
            depth += 1

    def note_parent(self, run_id: str, parent: Any) -> None:
        """Seed the parent cache from a run record's ``parent`` (saves a read)."""
        self._parents[run_id] = _link(parent)

    async def _parent_of(self, run_id: str) -> tuple[str, str, str] | None:
        if run_id in self._parents:
            return self._parents[run_id]
        record = await self.runs.get(run_id)
        link = _link(record.parent) if record is not None else None
        if len(self._parents) > 10_000:
            self._parents.clear()
        self._parents[run_id] = link
        return link


def public_message(message: Any) -> dict[str, Any]:
    """A ``TeamMessage`` as team events carry it: its wire dict without the claim token."""
    data = message.to_json_dict()  # a fresh dict: no need to copy the model first
    data["claim_token"] = None
    return data


def _link(parent: Any) -> tuple[str, str, str] | None:
    """``(parent run id, team, member)`` of a run record's ``parent``, or ``None``."""
    if parent is None or not getattr(parent, "run_id", None):
        return None
    team, _, member = parent.mailbox_id.rpartition("::")
    return parent.run_id, team, member


def _model_json(event: Any) -> str | None:
    """The JSON of a pydantic event model (``""`` for a token-level stream
    event, which is not stored), or ``None`` for anything else."""
    if isinstance(event, dict):
        return None
    dump_json = getattr(event, "model_dump_json", None)
    if not callable(dump_json):
        return None
    kind = getattr(event, "type", None)
    if kind == "stream_event":
        return ""
    if kind == "agent_message":
        message = getattr(event, "message", None)
        if isinstance(message, dict) and _is_stream_delta(message):
            return ""
    try:
        return str(dump_json())
    except Exception:  # left to the dict path (and its default=str)
        return None


def _is_stream_delta(data: dict[str, Any]) -> bool:
    while data.get("type") == "agent_message" and isinstance(data.get("message"), dict):
        data = data["message"]
    return data.get("type") == "stream_event"


def _event_dict(event: Any) -> dict[str, Any]:
    if isinstance(event, dict):
        return event
    dump = getattr(event, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return {"type": "unknown", "value": repr(event)}


__all__ = ["EventEmitter", "FenceSource", "current_fence", "public_message"]
