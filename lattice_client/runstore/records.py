"""The run store's data: run ids, work items, what its operations return, and reply parsing."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ..models import RunRecord, RunResult

RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""Allowed run ids: 1-128 characters from ``[A-Za-z0-9_.:-]``."""

DEFAULT_MAX_EVENTS = 10_000
"""Default approximate length bound of a run's event stream (entries)."""


def now_ms() -> int:
    """Milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` or raise ``ValueError`` when it is not 1-128 characters
    of ``[A-Za-z0-9_.:-]`` (it becomes part of Redis keys and a hash tag)."""
    if not isinstance(run_id, str) or not RUN_ID_PATTERN.fullmatch(run_id):
        raise ValueError(f"invalid run id {run_id!r}: expected 1-128 characters of [A-Za-z0-9_.:-]")
    return run_id


def dumps(value: Any, what: str) -> str:
    """Compact JSON; raise ``ValueError`` naming ``what`` when it is not serialisable."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} is not JSON-serialisable: {exc}") from None


def as_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class WorkItem(BaseModel):
    """Validation of one work item given to :meth:`RunStore.add_items`.

    Required: ``work_item_id``, ``message_id`` (the mailbox message carrying the
    work), ``mailbox_id``. Usual: ``member``, ``mode`` (``ask|handoff|observe``),
    ``tool_use_id``. Other keys are kept as given.
    """

    model_config = ConfigDict(extra="allow")

    work_item_id: str = Field(min_length=1)
    message_id: str = Field(min_length=1)
    mailbox_id: str = Field(min_length=1)
    member: str | None = None
    mode: str | None = None
    tool_use_id: str | None = None


@dataclass(frozen=True)
class CompleteResult:
    """What :meth:`RunStore.complete_item` decided.

    ``resume``: True exactly once per suspension: this completion emptied the
    wait set of a ``suspended`` run, which is now ``resuming`` (the caller sends
    ``lattice.resume_lead``). ``dispatch``: queued items that may be dispatched
    now (ring their doorbells). ``recorded``: False when the item was unknown,
    cleared or already completed (then nothing changed). ``run_status``: the
    run's status afterwards, so a caller can tell that nobody will read the
    outcome (a finished or cancelled run).
    """

    resume: bool
    dispatch: list[dict[str, Any]] = field(default_factory=list)
    recorded: bool = True
    run_status: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class SegmentStart:
    """A lead segment that :meth:`RunStore.begin_segment` started.

    ``token``: the lease token (pass it to every fenced write); ``lease_until``:
    ms since the epoch; ``attempts``: starts of this segment since the run's
    last suspension (1 on the first try); ``recover``: True when a worker died
    in the previous try and the segment must rebuild its state from the
    persisted history."""

    token: str
    lease_until: int
    attempts: int
    recover: bool
    record: RunRecord | None = None
    """The run record right after the start (``begin_segment(..., read_record=True)``)."""
    history: list[str] | None = None
    """The elements of the list ``begin_segment(..., history_key=)`` names, read
    right after the start (``[]`` when it does not exist)."""
    items: list[dict[str, Any]] | None = None
    """The run's registered items as :meth:`RunStore.items` lists them, read right
    after the start (``begin_segment(..., read_items=True)``)."""
    usage: dict[str, int] | None = None
    """The integer fields of the hash ``begin_segment(..., usage_key=)`` names
    (the worker's token usage totals), read right after the start."""


@dataclass(frozen=True)
class LeadRecovery:
    """What :meth:`RunStore.recover_lead` did to one run: ``action`` is
    ``"alive"`` (the lease is current; ``lease_until`` says until when),
    ``"gone"`` (not running any more, or unknown), ``"requeued"`` (now
    ``resuming`` with the recover flag: send ``lattice.resume_lead``) or
    ``"failed"`` (its attempts were used up; ``result`` is what was stored).
    ``attempts``: the expired segment's starts."""

    action: str
    attempts: int = 0
    lease_until: int | None = None
    result: RunResult | None = None
    record: RunRecord | None = None


@dataclass(frozen=True)
class EventFence:
    """What a run's event appends are fenced by (``append_events_fenced.lua``):
    a lead segment's lease (:meth:`RunStore.lead_events_fence`) or a member's
    claim on one work item (:meth:`RunStore.item_events_fence`). ``run_id``:
    the run whose stream it fences (other runs' streams are not fenced by it);
    ``key``: the hash checked (the run record, or the item's tool journal);
    ``args``: ``(kind, attempts or token, claim token, key expiry ms)`` as text."""

    run_id: str
    key: str
    args: tuple[str, str, str, str]


@dataclass(frozen=True)
class RunKeys:
    """The Redis keys of one run (all share the hash tag ``{run:<run_id>}``)."""

    record: str
    events: str
    items: str
    order: str
    state: str
    outcomes: str
    wait: str
    queued: str
    active: str
    calls: str = ""


def check_block_ms(block_ms: int | None) -> None:
    """Raise ``ValueError`` unless ``block_ms`` is ``None`` or an integer >= 1
    (``XREAD BLOCK 0`` would wait forever)."""
    if block_ms is not None and (isinstance(block_ms, bool) or not isinstance(block_ms, int) or block_ms < 1):
        raise ValueError(f"block_ms must be None or an integer >= 1, got {block_ms!r}")


def final_from_reply(reply: Any) -> tuple[bool, RunResult | None]:
    """:meth:`RunStore.final_result` from the reply of ``HMGET <record> status
    result`` (for callers reading with their own Redis client)."""
    status, result = reply
    if status is None:
        return False, None
    return True, (RunResult.model_validate_json(result) if result else None)


def result_from_reply(reply: Any) -> RunResult | None:
    """:meth:`RunStore.read_result` from the reply of ``XREAD COUNT 1 ...
    STREAMS <result stream> 0-0`` (for callers reading with their own Redis client)."""
    for _, fields in stream_entries(reply):
        event = decode_event(fields)
        if event.get("type") == "run_result":
            return RunResult.model_validate(event)
    return None


def to_lease_ms(lease_s: float) -> int:
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float) or not lease_s > 0:
        raise ValueError(f"lease_s must be a positive number of seconds, got {lease_s!r}")
    return max(1, int(lease_s * 1000))


def pairs(flat: Any) -> dict[str, str]:
    """A dict of a flat ``[field, value, ...]`` reply (a Lua script's ``HGETALL``)."""
    it = iter(flat or ())
    return {as_text(a): as_text(b) for a, b in zip(it, it, strict=False)}


def parse_items(order: Any, items: Any, states: Any, outcomes: Any) -> list[dict[str, Any]]:
    items = {as_text(a): as_text(b) for a, b in items.items()}
    states = {as_text(a): as_text(b) for a, b in states.items()}
    outcomes = {as_text(a): as_text(b) for a, b in outcomes.items()}
    result = []
    for raw_id in order:
        item_id = as_text(raw_id)
        if item_id not in items:
            continue
        item = json.loads(items[item_id])
        item["state"] = states.get(item_id, "queued")
        item["outcome"] = json.loads(outcomes[item_id]) if item_id in outcomes else None
        result.append(item)
    return result


def parse_record(raw: dict[str, str]) -> RunRecord:
    data: dict[str, Any] = {
        "run_id": raw["run_id"],
        "team": raw["team"],
        "team_ref": raw.get("team_ref") or None,
        "prompt": raw.get("prompt", ""),
        "status": raw["status"],
        "created_at": int(raw["created_at"]),
        "updated_at": int(raw.get("updated_at", raw["created_at"])),
        "metadata": json.loads(raw.get("metadata") or "{}"),
    }
    if raw.get("parent"):
        data["parent"] = json.loads(raw["parent"])
    if raw.get("result"):
        data["result"] = json.loads(raw["result"])
    if raw.get("max_active"):
        data["max_active"] = int(raw["max_active"])
    if raw.get("trace_carrier"):
        data["trace_carrier"] = json.loads(raw["trace_carrier"])
    if raw.get("budget_tokens"):
        data["budget_tokens"] = int(raw["budget_tokens"])
        data["spent_tokens"] = int(raw.get("spent_tokens") or 0)
    return RunRecord.model_validate(data)


def stream_entries(reply: Any) -> list[tuple[Any, dict[Any, Any]]]:
    """Entries of a one-stream XREAD reply in RESP2 (list) or RESP3 (dict) shape."""
    if not reply:
        return []
    if isinstance(reply, dict):
        streams = list(reply.values())  # RESP3: {key: [entries]}
        entries = streams[0][0] if streams and streams[0] else []
    else:
        entries = reply[0][1]
    return [(entry_id, fields) for entry_id, fields in entries]


def decode_event(fields: dict[Any, Any]) -> dict[str, Any]:
    data = {as_text(k): as_text(v) for k, v in fields.items()}.get("data")
    if data is None:
        return {"type": "invalid_event", "fields": {as_text(k): as_text(v) for k, v in fields.items()}}
    try:
        event = json.loads(data)
    except ValueError:
        return {"type": "invalid_event", "raw": data}
    return event if isinstance(event, dict) else {"type": "invalid_event", "raw": data}


__all__ = [
    "CompleteResult",
    "DEFAULT_MAX_EVENTS",
    "LeadRecovery",
    "RUN_ID_PATTERN",
    "RunKeys",
    "SegmentStart",
    "WorkItem",
    "check_block_ms",
    "check_run_id",
    "decode_event",
    "dumps",
    "final_from_reply",
    "to_lease_ms",
    "now_ms",
    "pairs",
    "parse_items",
    "parse_record",
    "result_from_reply",
    "stream_entries",
    "as_text",
]
