"""Crash-safe tool calls in the run store: the tool journal and the history of
each work item, the lead's own tool journal, and the waits a person decides
(parked calls and approvals). ``docs/tool-effects.md``.

Keys (``R`` = ``P:run:{run:<run_id>}``, so every script stays on one run's hash tag):

=============================  ======  ==========================================================
key                            type    content
=============================  ======  ==========================================================
``R:item:<work_item_id>:journal``  hash  tool_use_id -> call record JSON; ``approval:<tool_use_id>``
                                       -> decision JSON; ``~fence`` (the claim writing it);
                                       ``~waiting`` (the item's open wait)
``R:item:<work_item_id>:history``  list  the member's conversation on that item
``R:tools``                    hash    the lead's own tool journal (same fields, no fence: the lease fences it)
``R:waits``                    hash    wait id -> wait JSON (kind ``parked`` | ``approval``, run_id,
                                       team, member, message_id, tool_use_id, tool_name, input,
                                       effect, effect_key, reason, created_at, resolution)
``P:runs:waiting``             zset    run ids that have (or had) a wait or a budget park, by time
                                       (ms): the listing index
=============================  ======  ==========================================================

A call record (JSON): ``{"status": "started" | "completed", "effect_key", "started_at_ms",
"block"?, "end_turn"?, "structured_result"?}``.
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import ResponseError

from .core import RunStoreCore
from .records import EventFence, as_text, dumps, now_ms, pairs

ITEM_KEY_TTL_MS = 7 * 24 * 3600 * 1000
"""How long (milliseconds) a work item's journal and history are kept after their last write."""


class WaitStateError(ValueError):
    """A decision on a wait was refused (no such wait, the other kind, already
    decided, or its run is not waiting on it); nothing changed. ``code``:
    ``"nowait"``, ``"wrongkind"``, ``"badstate"``."""

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


class RunToolCalls(RunStoreCore):
    """The tool journals, item histories and waits (part of :class:`~lattice_client.runstore.RunStore`)."""

    # -- keys ---------------------------------------------------------------------------------

    def item_journal_key(self, run_id: str, work_item_id: str) -> str:
        """The tool journal hash of one work item of run ``run_id``."""
        return f"{self.keys(run_id).record}:item:{_check_part(work_item_id)}:journal"

    def item_events_fence(self, run_id: str, work_item_id: str, attempts: int, token: str) -> EventFence:
        """The fence of a member's events for one work item: its claim
        (``attempts``: the claim's count, ``token``: its token), checked against
        the item's ``~fence`` as the member's other item writes are (a later claim
        takes the item over). Raises ``ValueError`` on a bad id or an empty token."""
        if not token or isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise ValueError(f"an item events fence needs a claim token and attempts >= 0, got {attempts!r}")
        key = self.item_journal_key(run_id, work_item_id)
        return EventFence(run_id, key, ("item", str(attempts), token, str(ITEM_KEY_TTL_MS)))

    async def revoke_item_claim(self, run_id: str, work_item_id: str, attempts: int) -> bool:
        """Stop the writes of the expired claim ``attempts`` on one work item
        (``revoke_item_claim.lua``): its fenced item writes and run events are
        refused from now on, before any later claim begins. False when a later
        claim already holds the item. Raises ``ValueError`` on a bad id or attempts."""
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise ValueError(f"attempts must be an integer >= 0, got {attempts!r}")
        keys = [self.item_journal_key(run_id, work_item_id)]
        return bool(await self._run("revoke_item_claim", run_id, keys, [attempts, ITEM_KEY_TTL_MS]))

    def item_history_key(self, run_id: str, work_item_id: str) -> str:
        """The history list of one work item's member."""
        return f"{self.keys(run_id).record}:item:{_check_part(work_item_id)}:history"

    def tools_key(self, run_id: str) -> str:
        """The lead's own tool journal hash."""
        return f"{self.keys(run_id).record}:tools"

    def waits_key(self, run_id: str) -> str:
        """The hash of the run's open waits."""
        return f"{self.keys(run_id).record}:waits"

    # -- a member's work item ----------------------------------------------------------------

    def begin_item_call(
        self, run_id: str, work_item_id: str, attempts: int, token: str
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``begin_item.lua``: fence the item's writes by
        this claim (``attempts``: the claim's count; ``token``: its token) and
        read its history and journal. Read the reply with :meth:`begin_item_reply`."""
        keys = [
            self.item_journal_key(run_id, work_item_id),
            self.item_history_key(run_id, work_item_id),
            self.waits_key(run_id),
        ]
        return self._call("begin_item", keys, [int(attempts), token, ITEM_KEY_TTL_MS])

    @staticmethod
    def begin_item_reply(reply: Any) -> tuple[list[str], dict[str, Any]]:
        """``(history elements, journal)`` from a ``begin_item`` reply; the journal
        maps each field to its decoded JSON value (``~fence`` / ``~waiting`` left out)."""
        history, flat = reply
        journal = {k: json.loads(v) for k, v in pairs(flat).items() if not k.startswith("~")}
        return [as_text(h) for h in history], journal

    async def begin_item(
        self, run_id: str, work_item_id: str, attempts: int, token: str
    ) -> tuple[list[str], dict[str, Any]]:
        """:meth:`begin_item_call` run now. Raises :class:`RunLeaseLostError` when a
        later claim of the item already began."""
        (_, _, numkeys, *rest), _ = self.begin_item_call(run_id, work_item_id, attempts, token)
        reply = await self._run("begin_item", run_id, rest[:numkeys], rest[numkeys:])
        return self.begin_item_reply(reply)

    def write_item_call(
        self,
        run_id: str,
        work_item_id: str,
        attempts: int,
        token: str,
        history: list[str | bytes],
        journal: dict[str, Any] | None = None,
        *,
        replace: bool = False,
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``write_item.lua``: append ``history`` (encoded
        messages; ``replace``: the history becomes them) and set ``journal``
        fields (values encoded as JSON) under the claim (``attempts``, ``token``);
        its reply is the history's length, an error reply ``FENCED``
        (:meth:`script_error` -> ``RunLeaseLostError``) once a later claim holds the item."""
        keys = [self.item_journal_key(run_id, work_item_id), self.item_history_key(run_id, work_item_id)]
        mode = "replace" if replace else "append"
        args: list[Any] = [int(attempts), token, ITEM_KEY_TTL_MS, mode, len(history), *history]
        for field, value in (journal or {}).items():
            args += [field, dumps(value, f"journal field {field!r}")]
        return self._call("write_item", keys, args)

    def park_item_call(
        self, run_id: str, work_item_id: str, attempts: int, token: str, wait_id: str, wait: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``park_item.lua``: open the wait ``wait_id``
        (``wait``: its JSON object) for the item under the claim (``attempts``, ``token``)."""
        keys = [self.item_journal_key(run_id, work_item_id), self.waits_key(run_id)]
        return self._call("park_item", keys, [int(attempts), token, wait_id, dumps(wait, "wait")])

    # -- the lead's own tools -----------------------------------------------------------------

    def journal_tool_call(
        self, run_id: str, token: str, fields: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``journal_tool.lua``: set ``fields`` of the
        lead's tool journal under the segment's lease ``token``."""
        args: list[Any] = [token, ITEM_KEY_TTL_MS]
        for field, value in fields.items():
            args += [field, dumps(value, f"journal field {field!r}")]
        return self._call("journal_tool", [self.keys(run_id).record, self.tools_key(run_id)], args)

    async def lead_tool_journal(self, run_id: str) -> dict[str, Any]:
        """The lead's tool journal: field -> decoded JSON value."""
        raw = await self._conn().client.hgetall(self.tools_key(run_id))
        return {as_text(k): json.loads(as_text(v)) for k, v in raw.items()}

    def park_lead_call(
        self, run_id: str, token: str, wait_id: str, wait: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``park_lead.lua``: suspend the run on the
        wait ``wait_id`` under the segment's lease ``token`` (the lease index
        entry is the caller's to remove)."""
        keys = [self.keys(run_id).record, self.waits_key(run_id)]
        return self._call("park_lead", keys, [token, wait_id, dumps(wait, "wait"), now_ms()])

    # -- waits --------------------------------------------------------------------------------

    async def waits(self, *, kind: str | None = None) -> list[dict[str, Any]]:
        """Every open, undecided wait of runs that are not finished, oldest first;
        only those of ``kind`` (``"parked"`` / ``"approval"``) when given.
        Finished (or expired) runs are dropped from the listing index; a run
        that is still going keeps its place even with no wait open now, since
        its next wait may be written while this listing reads (dropping it then
        would hide that wait from every later listing)."""
        client = self._conn().client
        run_ids = [as_text(r) for r in await client.zrange(self.waiting_index_key, 0, -1)]
        if not run_ids:
            return []
        async with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hgetall(self.waits_key(run_id))
                pipe.hget(self.keys(run_id).record, "status")
            replies = await pipe.execute()
        found: list[dict[str, Any]] = []
        finished: list[str] = []
        for i, run_id in enumerate(run_ids):
            raw, status = replies[2 * i], replies[2 * i + 1]
            status = as_text(status) if status is not None else None
            if status in (None, "completed", "failed", "cancelled"):
                finished.append(run_id)
                continue
            for value in raw.values():
                wait = json.loads(as_text(value))
                if wait.get("resolution") is None and (kind is None or wait.get("kind") == kind):
                    found.append(wait)
        if finished:
            await client.zrem(self.waiting_index_key, *finished)
        found.sort(key=lambda w: (w.get("created_at") or 0, str(w.get("id"))))
        return found

    async def get_wait(self, run_id: str, wait_id: str) -> dict[str, Any] | None:
        """One wait of run ``run_id`` (decided or not), or ``None``."""
        raw = await self._conn().client.hget(self.waits_key(run_id), wait_id)
        return json.loads(as_text(raw)) if raw is not None else None

    async def resolve_wait(
        self,
        run_id: str,
        wait_id: str,
        *,
        kind: str,
        journal_key: str,
        field: str,
        value: Any = None,
        delete: bool = False,
        resolution: dict[str, Any],
    ) -> tuple[bool, dict[str, Any]]:
        """Record a person's decision on the wait ``wait_id`` (``resolve_wait.lua``):
        set the journal field ``field`` of ``journal_key`` to ``value`` (or
        ``delete`` it), mark the wait with ``resolution``; a lead's wait also
        moves the run to ``resuming`` (send ``lattice.resume_lead``).

        Returns ``(True, wait)`` when recorded now, ``(False, wait)`` when the wait
        had been decided already (``wait["resolution"]``; nothing changed).
        Raises :class:`WaitStateError` (``nowait`` / ``wrongkind`` / ``badstate``)."""
        args = [
            wait_id,
            kind,
            field,
            "del" if delete else "set",
            "" if delete else dumps(value, "decision"),
            dumps(resolution, "resolution"),
            now_ms(),
        ]
        keys = [self.keys(run_id).record, self.waits_key(run_id), journal_key]
        try:
            status, raw = await self._conn().scripts["resolve_wait"](keys=keys, args=args)
        except ResponseError as exc:
            message = str(exc)
            code = message.split(" ", 1)[0].lower()
            if code in ("nowait", "wrongkind", "badstate"):
                raise WaitStateError(message, code=code) from None
            raise
        return as_text(status) == "OK", json.loads(as_text(raw))


def _check_part(value: str) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "{}"):
        raise ValueError(f"invalid work item id {value!r}")
    return value


__all__ = ["ITEM_KEY_TTL_MS", "RunToolCalls", "WaitStateError"]
