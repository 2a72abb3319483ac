"""Token budgets of runs (issue 22): the spend, the parks and the raise.

A run with a budget holds on its record ``budget_tokens`` (the budget, a
positive integer) and ``spent_tokens`` (input, prompt-cache and output tokens of every model
call of the run so far, lead and members, from every worker: ``HINCRBY`` in
``spend_budget.lua``). Before each model call the step checks both and
reserves the call's estimated tokens (``reserve_budget.lua``: the zset
``R:budget_calls`` of the calls in flight, each reservation with an expiry),
so calls in flight at once cannot together go past the budget: a call that
does not fit waits for those in flight to land, and only a call alone may go
past it. Once the spend reaches the budget the step parks instead of calling:

* a lead segment: ``park_budget_lead.lua`` -- the run becomes
  ``budget_reached`` (``budget_parked = "lead"``), its lead lease is removed;
* a member on a work item: ``park_budget_item.lua`` -- the item goes into the
  run's budget waits (hash ``R:budget_waits``, work_item_id -> JSON) and its
  message to ``parked``; a run ``suspended`` on its items becomes ``budget_reached``.

:meth:`RunBudgets.raise_budget` (``raise_budget.lua``) sets a new total and
says what to move on: the lead to resume, the members' messages to put back.
"""

from __future__ import annotations

import json
from typing import Any

from redis.exceptions import ResponseError

from ..errors import RunNotFoundError
from .core import RunStoreCore
from .records import as_text, dumps, now_ms


class BudgetError(ValueError):
    """A budget raise was refused and nothing changed: the run is finished,
    has no budget, has not reached it, the new total is not above its spend,
    or another total than that of a raise still moving its parked members on
    (the message says which)."""


class BudgetRaise:
    """What :meth:`RunBudgets.raise_budget` did: ``resume_lead`` (the lead was
    parked: the run is ``resuming`` now, the caller sends ``lattice.resume_lead``),
    ``previous`` (the budget before, tokens), ``spent`` (tokens) and
    ``waits`` (the members' parked items: dicts with ``message_id``,
    ``mailbox_id``, ``team``, ``member``, ``work_item_id``; the caller moves
    their messages back to ``pending``, rings their doorbells, then drops each
    wait with :meth:`RunBudgets.drop_budget_wait`)."""

    def __init__(self, resume_lead: bool, previous: int, spent: int, waits: list[dict[str, Any]]) -> None:
        self.resume_lead = resume_lead
        self.previous = previous
        self.spent = spent
        self.waits = waits


class RunBudgets(RunStoreCore):
    """Token budgets (part of :class:`~lattice_client.runstore.RunStore`)."""

    def budget_waits_key(self, run_id: str) -> str:
        """The hash of the run's work items parked on its budget."""
        return f"{self.keys(run_id).record}:budget_waits"

    def budget_read_command(self, run_id: str) -> tuple[Any, ...]:
        """``HMGET`` of the record's ``budget_tokens``, ``spent_tokens`` (see :func:`budget_reply`)."""
        return ("hmget", self.keys(run_id).record, ["budget_tokens", "spent_tokens"])

    def budget_calls_key(self, run_id: str) -> str:
        """The zset of the run's model calls in flight with a reservation
        (``"<call id>|<tokens>"`` scored by the reservation's expiry, ms)."""
        return f"{self.keys(run_id).record}:budget_calls"

    def reserve_call(
        self, run_id: str, call_id: str, estimate: int, hold_ms: int
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``reserve_budget.lua``: check the run's
        spend and reserve a call's tokens (``estimate``: the request's own, an
        int >= 0; ``hold_ms``: the reservation's lifetime, ms). Reply: see
        :func:`reserve_reply`."""
        keys = [self.keys(run_id).record, self.budget_calls_key(run_id)]
        return self._call("reserve_budget", keys, [call_id, max(int(estimate), 0), int(hold_ms)])

    def renew_call(self, run_id: str, reservation: str, hold_ms: int) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``renew_budget.lua``: the call of
        ``reservation`` is still in flight; it holds ``hold_ms`` more (ms)."""
        return self._call("renew_budget", [self.budget_calls_key(run_id)], [reservation, int(hold_ms)])

    def spend_call(self, run_id: str, tokens: int, reservation: str = "") -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``spend_budget.lua``: add ``tokens`` to the
        run's spend and release ``reservation`` (from :meth:`reserve_call`; ``""``: none)."""
        keys = [self.keys(run_id).record, self.budget_calls_key(run_id)]
        return self._call("spend_budget", keys, [int(tokens), reservation])

    def park_budget_lead_call(self, run_id: str, token: str) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``park_budget_lead.lua`` under the lead lease ``token``."""
        return self._call("park_budget_lead", [self.keys(run_id).record], [token, now_ms()])

    def park_budget_item_call(
        self, run_id: str, work_item_id: str, wait: dict[str, Any]
    ) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``park_budget_item.lua``: park a member's item on the budget."""
        keys = [self.keys(run_id).record, self.budget_waits_key(run_id)]
        return self._call("park_budget_item", keys, [work_item_id, dumps(wait, "wait"), now_ms()])

    def default_budget_call(self, run_id: str, tokens: int) -> tuple[tuple[Any, ...], str]:
        """``(command, source)`` of ``default_budget.lua``: the team's default
        budget ``tokens`` unless the run has its own (reply: the run's budget, 0 = no run)."""
        return self._call("default_budget", [self.keys(run_id).record], [int(tokens)])

    async def drop_budget_wait(self, run_id: str, work_item_id: str) -> None:
        """Remove a member's budget wait once its message was moved on (see ``raise_budget.lua``)."""
        await self._conn().client.hdel(self.budget_waits_key(run_id), work_item_id)

    async def budget_waits(self) -> list[dict[str, Any]]:
        """The work parked at a run's budget, of every unfinished run of the
        listing index (``P:runs:waiting``; a budget park adds its run), oldest
        first: a lead parked at it (``member`` ``"lead"``, ``message_id`` /
        ``work_item_id`` ``None``; ``created_at`` = the park's time) and each
        member's work item (``R:budget_waits``). Each a dict with ``run_id``,
        ``team``, ``member``, ``message_id``, ``mailbox_id``, ``work_item_id``,
        ``reason``, ``created_at`` (ms), ``spent_tokens`` and ``budget_tokens``
        (the run's now). Only reads; finished runs are skipped."""
        client = self._conn().client
        run_ids = [as_text(r) for r in await client.zrange(self.waiting_index_key, 0, -1)]
        if not run_ids:
            return []
        fields = ["status", "budget_parked", "team", "spent_tokens", "budget_tokens", "updated_at"]
        async with client.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.hmget(self.keys(run_id).record, fields)
                pipe.hgetall(self.budget_waits_key(run_id))
            replies = await pipe.execute()
        found: list[dict[str, Any]] = []
        for i, run_id in enumerate(run_ids):
            values, raw = replies[2 * i], replies[2 * i + 1]
            status, parked, team, spent, budget, updated = (
                as_text(v) if v is not None else None for v in values
            )
            if status in (None, "completed", "failed", "cancelled") or budget is None:
                continue
            run = {"run_id": run_id, "spent_tokens": int(spent or 0), "budget_tokens": int(budget)}
            if status == "budget_reached" and parked == "lead":
                found.append(
                    {
                        "team": team,
                        "member": "lead",
                        "message_id": None,
                        "mailbox_id": None,
                        "work_item_id": None,
                        "reason": f"the run's budget is spent ({spent or 0} of {budget} tokens)",
                        "created_at": int(updated or 0),
                        **run,
                    }
                )
            for value in raw.values():
                found.append({**json.loads(as_text(value)), **run})
        found.sort(key=lambda w: (w.get("created_at") or 0, str(w.get("message_id") or w["run_id"])))
        return found

    async def budget(self, run_id: str) -> tuple[int | None, int]:
        """``(budget tokens or None, spent tokens)`` of the run (``(None, 0)`` for an unknown run)."""
        raw = await self._conn().client.hmget(self.keys(run_id).record, ["budget_tokens", "spent_tokens"])
        return budget_reply(raw)

    async def raise_budget(self, run_id: str, tokens: int) -> BudgetRaise:
        """Set run ``run_id``'s token budget to ``tokens`` (the new total, a
        positive int above the spend) and move on what it parked (see
        :class:`BudgetRaise`). Raises :class:`RunNotFoundError` for an unknown
        run, :class:`BudgetError` when refused (finished run, no budget, budget
        not reached, ``tokens`` not above the spend, members' waits left by a
        raise to another total) and ``ValueError`` for a ``tokens`` that is
        not a positive int; nothing changes then."""
        check_tokens(tokens)
        keys = [self.keys(run_id).record, self.budget_waits_key(run_id)]
        try:
            reply = await self._conn().scripts["raise_budget"](keys=keys, args=[tokens, now_ms()])
        except ResponseError as exc:
            raise _raise_error(exc, run_id, tokens) from None
        resume, previous, spent, *waits = reply
        return BudgetRaise(
            bool(int(resume)), int(previous), int(spent), [json.loads(as_text(w)) for w in waits]
        )


def check_tokens(tokens: Any) -> int:
    """``tokens`` when it is a positive int (not a bool), else ``ValueError``."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive integer, got {tokens!r}")
    return tokens


def budget_reply(raw: list[Any]) -> tuple[int | None, int]:
    """``(budget or None, spent)`` from the reply of :meth:`RunBudgets.budget_read_command`."""
    budget, spent = (as_text(v) if v is not None else None for v in raw)
    return (int(budget) if budget else None), (int(spent) if spent else 0)


def reserve_reply(raw: list[Any]) -> tuple[str, int, int, str | int]:
    """``(outcome, spent, budget, detail)`` of a ``reserve_budget.lua`` reply:
    outcome ``"go"`` (detail: the reservation to release, ``""`` for none),
    ``"reached"`` or ``"wait"`` (detail: ms until the earliest reservation
    lapses); ``budget`` -1: the run has no budget."""
    outcome, spent, budget, detail = raw
    outcome = as_text(outcome)
    detail = int(detail) if outcome == "wait" else as_text(detail)
    return outcome, int(spent), int(budget), detail


def _raise_error(exc: ResponseError, run_id: str, tokens: int) -> Exception:
    message = str(exc)
    if message.startswith("NORUN"):
        return RunNotFoundError(run_id)
    if message.startswith("BADSTATE"):
        status = message.split(" ", 1)[1] if " " in message else "finished"
        return BudgetError(f"run {run_id} is {status}: its budget cannot be raised")
    if message.startswith("NOBUDGET"):
        return BudgetError(f"run {run_id} has no budget (submit it with budget={{'tokens': N}})")
    if message.startswith("NOTREACHED"):
        _, spent, budget = message.split()
        return BudgetError(
            f"run {run_id} has not reached its budget ({spent} of {budget} tokens spent): "
            "a budget is raised once the run reached it"
        )
    if message.startswith("MOVING"):
        budget = message.split()[1]
        return BudgetError(
            f"run {run_id}'s budget was raised to {budget} tokens and its parked members are "
            f"still being moved on (by that raise, or left by one that stopped): tokens={tokens} "
            f"would replace that total; repeat the raise with tokens={budget} to finish it"
        )
    if message.startswith("TOOLOW"):
        spent = message.split()[1]
        return BudgetError(
            f"tokens={tokens} is not above run {run_id}'s spend ({spent} tokens): "
            "tokens is the new total budget, not an increment"
        )
    return exc


__all__ = ["BudgetError", "BudgetRaise", "RunBudgets", "budget_reply", "check_tokens", "reserve_reply"]
