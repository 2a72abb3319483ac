"""Recovery by effect: what to do with a tool call a crash interrupted
(``docs/tool-effects.md``), and the journal seam a runtime implements.

A runtime that survives crashes (the distributed runtime) gives the query a
``tool_journal`` (see :class:`ToolJournal`): every call is recorded
``started`` before its handler runs and ``completed`` with its result after.
When the work is picked up again, each call of the interrupted batch is
looked up: a ``completed`` call is never run again (its recorded result is
used), a call never recorded runs normally, and a call recorded ``started``
but not ``completed`` is decided by :func:`decide_recovery` from its tool's
effect:

* ``read_only`` -- run again;
* ``idempotent`` -- sent again (same effect key) while inside
  ``dedup_window_s`` of its first start, parked after it;
* ``reconcilable`` -- ``reconcile.lookup(effect_key)``: found -> its value is
  the result and the handler does not run; not found with
  ``finality="final"`` -> run again; not found with ``"nonfinal"``, unknown,
  or a failing lookup -> parked;
* ``unguarded`` -- parked: a person decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .effects import LookupFound, LookupNotFound, LookupUnknown
from .tool import ToolDefinition, ToolResult, normalize_tool_output


@dataclass
class JournalCall:
    """One tool call as the journal sees it.

    ``tool_use_id``: the model's id for the call; ``tool_name``; ``input``: the
    raw input the model sent; ``effect``: the tool's effect; ``effect_key``:
    :attr:`~lattice_worker.tools.tool.ToolContext.effect_key`.
    """

    tool_use_id: str
    tool_name: str
    input: Any
    effect: str
    effect_key: str


@dataclass
class JournalRecord:
    """What the journal holds for one call.

    ``status``: ``"started"`` (the handler may have begun; no result recorded)
    or ``"completed"``. ``started_at_ms``: when the call *first* started, ms since
    the epoch (a resend keeps it: the provider's dedup window runs from the
    first request). ``block``: the recorded ``tool_result`` block (completed
    only); ``end_turn`` / ``structured_result``: what the handler's
    :class:`~lattice_worker.tools.tool.ToolResult` carried.
    """

    tool_use_id: str
    status: Literal["started", "completed"]
    effect_key: str
    started_at_ms: int
    block: dict[str, Any] | None = None
    end_turn: bool = False
    structured_result: Any = None


@runtime_checkable
class ToolJournal(Protocol):
    """The journal seam: ``runtime.tool_journal`` of a query, when the runtime has one.

    ``entry`` returns the record of a call or ``None``; ``started`` must be
    durable when it returns (the handler runs next; it is called again when a
    recovered call runs again, and must keep the first ``started_at_ms``); ``completed`` records the
    result (a runtime may store it with its next write: a crash before then is
    a crash "before the result was recorded"); ``park`` records that the call
    waits for a person and raises
    :class:`~lattice_worker.agent.suspend.SuspendQuery` so the query stops
    with its history ending in the unanswered assistant turn.
    """

    async def entry(self, call: JournalCall) -> JournalRecord | None: ...

    async def started(self, call: JournalCall) -> None: ...

    async def completed(self, call: JournalCall, record: JournalRecord) -> None: ...

    async def park(self, call: JournalCall, reason: str) -> None: ...


@dataclass
class RecoveryDecision:
    """What to do with one call: ``"run"`` the handler, ``"use"`` ``result``
    without running it, or ``"park"`` it for a person; ``reason`` says why
    (for logs and for the person)."""

    action: Literal["run", "use", "park"]
    reason: str
    result: ToolResult | None = field(default=None, repr=False)


async def decide_recovery(
    tool: ToolDefinition | None, record: JournalRecord, *, effect_key: str, now_ms: int
) -> RecoveryDecision:
    """Decide an interrupted call (``record.status == "started"``) by its tool's
    effect (module doc). ``tool`` ``None`` (no longer registered) parks.
    ``now_ms``: the current time, ms since the epoch. Never raises: a failing
    lookup or a found value that is not a valid tool result parks."""
    if tool is None:
        return RecoveryDecision("park", "the interrupted call's tool is no longer registered")
    effect = tool.effect
    if effect == "read_only":
        return RecoveryDecision("run", "read_only: safe to run again")
    if effect == "idempotent":
        window = tool.dedup_window_s or 0.0
        elapsed_s = max(0, now_ms - record.started_at_ms) / 1000.0
        if elapsed_s <= window:
            return RecoveryDecision(
                "run",
                f"idempotent: sent again with the same key, {elapsed_s:.0f} s into its {window:g} s window",
            )
        return RecoveryDecision(
            "park",
            f"idempotent: the provider's dedup window ({window:g} s) passed {elapsed_s - window:.0f} s ago, "
            "so sending it again could repeat the effect",
        )
    if effect == "reconcilable":
        assert tool.reconcile is not None
        answer = await tool.reconcile.ask(effect_key)
        if isinstance(answer, LookupFound):
            try:
                result = normalize_tool_output(tool.name, answer.value)
            except Exception as exc:
                return RecoveryDecision(
                    "park", f"reconcilable: the lookup found a value that is not a result ({exc})"
                )
            return RecoveryDecision("use", "reconcilable: the lookup found the call", result)
        if isinstance(answer, LookupNotFound):
            if tool.reconcile.finality == "final":
                return RecoveryDecision("run", "reconcilable: the lookup proves the call never happened")
            return RecoveryDecision(
                "park", "reconcilable: not found yet, and a nonfinal lookup cannot prove it never happened"
            )
        assert isinstance(answer, LookupUnknown)
        return RecoveryDecision("park", f"reconcilable: the lookup could not tell ({answer.reason})")
    return RecoveryDecision(
        "park", "unguarded: the call was interrupted and may or may not have happened; a person must decide"
    )


__all__ = [
    "JournalCall",
    "JournalRecord",
    "RecoveryDecision",
    "ToolJournal",
    "decide_recovery",
]
