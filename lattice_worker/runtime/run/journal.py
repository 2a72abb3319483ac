"""Crash-safe tool calls in a worker: the tool journal of a member's work item
(and the base of a lead segment's, :mod:`lattice_worker.runtime.lead.journal`), the member's persisted history, and the waits a person
decides (``docs/tool-effects.md``).

Each is the query runtime's ``tool_journal`` (:class:`~lattice_worker.tools.recovery.ToolJournal`),
its ``effect_scope`` and its ``approve_tool_call`` (docs/contracts.md):

* a call is recorded ``started`` before its handler runs -- a write that is
  stored before the handler starts, in one round trip with whatever the
  history queued before it (the assistant turn holding the call), so history
  and journal never disagree -- and ``completed`` with its result after (queued:
  it goes with the next write, the tool_result message beside it);
* a re-claimed member or a recovered lead reads them back: completed calls are
  reused, interrupted ones decided by their effect (:func:`~lattice_worker.tools.recovery.decide_recovery`);
* a call that must wait for a person (parked, or an approval under
  ``permission_mode="by_effect"``) opens a *wait* in the run store, and the work
  stops with no worker waiting: a member's message becomes ``parked``, a lead's
  run ``suspended`` on it. ``LatticeClient.resolve`` / ``approve`` / ``deny``
  record the decision in the journal and send the work on again.

Wait ids: a member's parked call is its message id; a member's approval is
``<message id>/<tool_use_id>``; a lead's wait (parked or approval) is
``<run id>/<tool_use_id>``.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from lattice_client.errors import ItemClaimLostError, RunLeaseLostError
from lattice_client.runstore import RunStore, now_ms

from ...agent.approvals import ApprovalRequest
from ...agent.history_stores import RedisHistoryStore
from ...agent.suspend import SuspendQuery
from ...tools.recovery import JournalCall, JournalRecord
from .replay import ReplayedTurn, encode_message
from .writer import QueuedWrite, RunWriter

logger = logging.getLogger("lattice_worker.runtime")

APPROVAL_FIELD = "approval:{tool_use_id}"
"""The journal field holding a person's decision on a call's approval."""


def record_to_json(record: JournalRecord) -> dict[str, Any]:
    """A journal record as stored (JSON object)."""
    data: dict[str, Any] = {
        "status": record.status,
        "effect_key": record.effect_key,
        "started_at_ms": record.started_at_ms,
    }
    if record.status == "completed":
        data["block"] = record.block
        data["end_turn"] = record.end_turn
        data["structured_result"] = record.structured_result
    return data


def record_from_json(tool_use_id: str, data: Any) -> JournalRecord | None:
    """The stored JSON object back as a :class:`JournalRecord` (``None`` when malformed)."""
    if not isinstance(data, dict) or data.get("status") not in ("started", "completed"):
        return None
    block = data.get("block")
    return JournalRecord(
        tool_use_id=tool_use_id,
        status=data["status"],
        effect_key=str(data.get("effect_key") or ""),
        started_at_ms=int(data.get("started_at_ms") or 0),
        block=block if isinstance(block, dict) else None,
        end_turn=bool(data.get("end_turn")),
        structured_result=data.get("structured_result"),
    )


class Journal:
    """What both journals share: the records read when the work began, the
    wait they open, the approvals they ask for."""

    def __init__(self, ctx: Any, run_id: str, team: str, member: str, scope: str) -> None:
        self.ctx = ctx
        self.runs: RunStore = ctx.runs
        self.writer: RunWriter = ctx.writer
        self.run_id = run_id
        self.team = team
        self.member = member
        self.effect_scope = scope
        self.records: dict[str, Any] = {}
        self.waiting: dict[str, Any] | None = None
        """The wait this attempt opened (the work stopped on it), or ``None``."""
        self._unsynced = False  # a completion of a call with effects is still only queued

    # -- ToolJournal -------------------------------------------------------------------------

    async def entry(self, call: JournalCall) -> JournalRecord | None:
        await self._load()
        return record_from_json(call.tool_use_id, self.records.get(call.tool_use_id))

    async def started(self, call: JournalCall) -> None:
        old = record_from_json(call.tool_use_id, self.records.get(call.tool_use_id))
        first = old.started_at_ms if old is not None and old.status == "started" else now_ms()
        record = JournalRecord(call.tool_use_id, "started", call.effect_key, first)
        value = record_to_json(record)
        self.records[call.tool_use_id] = value
        # Stored before the handler runs, with what the history queued (the assistant
        # turn) -- except a read-only call's start (it may run again after a crash),
        # unless an earlier call's completion is still only queued: no handler runs
        # before the completions of calls with effects are stored.
        durable = call.effect != "read_only" or self._unsynced
        await self._set({call.tool_use_id: value}, durable=durable)
        if durable:
            self._unsynced = False

    async def completed(self, call: JournalCall, record: JournalRecord) -> None:
        # queued: it goes with the next write (the next call's start, the end of the step)
        value = record_to_json(record)
        self.records[call.tool_use_id] = value
        await self._set({call.tool_use_id: value}, durable=False)
        if call.effect != "read_only":
            self._unsynced = True

    async def park(self, call: JournalCall, reason: str) -> None:
        await self._open_wait(self._wait_id(call.tool_use_id, "parked"), "parked", call, reason)

    async def approve_tool_call(self, request: ApprovalRequest) -> dict[str, Any]:
        """The decision recorded for this call's approval; without one, open an
        approval wait and stop the query (:class:`SuspendQuery`)."""
        await self._load()
        decision = self.records.get(APPROVAL_FIELD.format(tool_use_id=request.tool_use_id))
        if isinstance(decision, dict) and decision.get("behavior") in ("allow", "deny"):
            return decision
        call = JournalCall(
            request.tool_use_id, request.tool_name, request.input, request.effect, request.effect_key or ""
        )
        reason = f'permission_mode="by_effect": a call of a tool whose effect is "{request.effect}" needs an approval'
        await self._open_wait(self._wait_id(request.tool_use_id, "approval"), "approval", call, reason)
        raise SuspendQuery(f"tool call {request.tool_use_id} waits for an approval")

    # -- shared ------------------------------------------------------------------------------

    def _wait(self, wait_id: str, kind: str, call: JournalCall, reason: str) -> dict[str, Any]:
        return {
            "id": wait_id,
            "kind": kind,
            "run_id": self.run_id,
            "team": self.team,
            "member": self.member,
            "message_id": None,
            "work_item_id": None,
            "tool_use_id": call.tool_use_id,
            "tool_name": call.tool_name,
            "input": call.input,
            "effect": call.effect,
            "effect_key": call.effect_key,
            "reason": reason,
            "created_at": now_ms(),
            "resolution": None,
        }

    async def _open_wait(self, wait_id: str, kind: str, call: JournalCall, reason: str) -> None:
        wait = self._wait(wait_id, kind, call, reason)
        await self._store_wait(wait_id, wait)
        self.waiting = wait
        event = {"type": "tool_parked" if kind == "parked" else "approval_pending", **wait}
        await self.ctx.events.emit(self.run_id, event)
        logger.warning(
            "run %s: %s's call %s (%s, %s) waits for a person as %s: %s",
            self.run_id,
            self.member,
            call.tool_use_id,
            call.tool_name,
            call.effect,
            wait_id,
            reason,
        )

    async def _load(self) -> None:  # the records are read when the work begins
        return None

    def _wait_id(self, tool_use_id: str, kind: str) -> str:
        raise NotImplementedError

    async def _set(self, fields: dict[str, Any], *, durable: bool) -> None:
        raise NotImplementedError

    async def _store_wait(self, wait_id: str, wait: dict[str, Any]) -> None:
        raise NotImplementedError


class ItemJournal(Journal):
    """The tool journal of one member attempt at a work item, fenced by its
    claim (``attempts``, ``token``): a worker whose claim was taken over writes
    nothing more (:class:`~lattice_client.errors.ItemClaimLostError`)."""

    def __init__(
        self,
        ctx: Any,
        run_id: str,
        team: str,
        member: str,
        message: Any,
        records: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(ctx, run_id, team, member, str(message.work_item_id))
        self.message = message
        self.work_item_id = str(message.work_item_id)
        self.attempts = int(message.attempts)
        self.token = str(message.claim_token or "")
        self.records = dict(records or {})

    def _failed(self, operation: str) -> Any:
        def mapped(exc: BaseException) -> BaseException:
            error = self.runs.script_error(exc, self.run_id, operation)
            if isinstance(error, RunLeaseLostError):
                return ItemClaimLostError(self.run_id, self.work_item_id, operation)
            return error

        return mapped

    def write_call(
        self, history: list[bytes], fields: dict[str, Any] | None = None, *, replace: bool = False
    ) -> tuple[tuple[Any, ...], str]:
        return self.runs.write_item_call(
            self.run_id, self.work_item_id, self.attempts, self.token, history, fields, replace=replace
        )

    async def _set(self, fields: dict[str, Any], *, durable: bool) -> None:
        command, source = self.write_call([], fields)
        if durable:
            await self.writer.write([command], scripts=(source,), on_error=self._failed("write_item"))
        else:
            self.writer.queue_write(
                [command], scripts=(source,), fence=self.token, on_error=self._failed("write_item")
            )

    def _wait_id(self, tool_use_id: str, kind: str) -> str:
        return self.message.id if kind == "parked" else f"{self.message.id}/{tool_use_id}"

    def _wait(self, wait_id: str, kind: str, call: JournalCall, reason: str) -> dict[str, Any]:
        wait = super()._wait(wait_id, kind, call, reason)
        wait["message_id"] = self.message.id
        wait["mailbox_id"] = self.message.to
        wait["work_item_id"] = self.work_item_id
        return wait

    async def _store_wait(self, wait_id: str, wait: dict[str, Any]) -> None:
        # the wait first, then the message: a crash in between leaves a message
        # still processing, re-claimed when its lease expires, and parked again
        command, source = self.runs.park_item_call(
            self.run_id, self.work_item_id, self.attempts, self.token, wait_id, wait
        )
        await self.writer.write(
            [command, self.runs.index_wait_command(self.run_id)],
            scripts=(source,),
            on_error=self._failed("park_item"),
        )
        await self.ctx.mailbox.complete(self.message.id, self.token, "parked")


class ItemHistoryStore(ReplayedTurn, RedisHistoryStore):
    """A member's history on one work item (``RunStore.item_history_key``),
    written only under the item's claim through the worker's writer (queued:
    it goes with the journal's next write, so a call's assistant turn is stored
    before its ``started`` record). ``history``: the elements ``begin_item``
    read, returned by the first ``load``. A turn it :meth:`~.replay.ReplayedTurn.hold` s
    stays stored until the model "returns" it (:class:`~.replay.ReplayedTurn`)."""

    def __init__(self, journal: ItemJournal, history: list[str] | None = None) -> None:
        runs = journal.runs
        super().__init__(
            journal.ctx.client,
            runs.item_history_key(journal.run_id, journal.work_item_id),
            fail_on_error=True,
        )
        self.journal = journal
        self._preloaded = history
        self._queued: QueuedWrite | None = None
        self._queued_values: list[bytes] = []
        self._queued_replace = False

    async def load(self) -> list[dict[str, Any]]:
        preloaded, self._preloaded = self._preloaded, None
        if preloaded is not None:
            return self._decode_list(preloaded)
        await self.journal.writer.sync(self.journal.token)
        return await super().load()

    def _queue(self, values: list[bytes], *, replace: bool) -> None:
        writer = self.journal.writer
        if not replace and self._queued is not None and writer.last_queued(self._queued):
            # the previous history write is still the last one waiting: one script
            # call writes both (the same messages in the same order, same claim)
            values = self._queued_values + values
            replace = self._queued_replace
            self._queued.commands[0], _ = self.journal.write_call(values, replace=replace)
            self._queued_values = values
            return
        command, source = self.journal.write_call(values, replace=replace)
        self._queued = writer.queue_write(
            [command],
            scripts=(source,),
            fence=self.journal.token,
            on_error=self.journal._failed("write_item"),
        )
        self._queued_values = values
        self._queued_replace = replace

    async def append(self, message: dict[str, Any]) -> None:
        if await self.append_held(message):
            return
        self._queue([encode_message(message, "ItemHistoryStore.append")], replace=False)

    async def replace(self, messages: list[dict[str, Any]]) -> None:
        if not isinstance(messages, list):
            raise TypeError(f"ItemHistoryStore.replace: expected a list, got {type(messages).__name__}")
        self.release()
        self._queue([encode_message(m, "ItemHistoryStore.replace") for m in messages], replace=True)


def decode_history(elements: list[str]) -> list[dict[str, Any]]:
    """History elements (JSON text) as message dicts, malformed ones skipped."""
    out = []
    for element in elements:
        try:
            message = json.loads(element)
        except ValueError:
            continue
        if isinstance(message, dict):
            out.append(message)
    return out


__all__ = [
    "APPROVAL_FIELD",
    "Journal",
    "ItemHistoryStore",
    "ItemJournal",
    "decode_history",
    "record_from_json",
    "record_to_json",
]
