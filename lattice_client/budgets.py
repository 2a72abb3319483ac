"""Token budgets of runs (issue 22): ``submit(..., budget={"tokens": N})``,
``raise_budget(run_id, tokens=N)`` and the CLI's ``lattice budget RUN --tokens N``.

A run with a budget counts the tokens (input, prompt-cache reads and writes,
output) of every model call of its lead and its members, on every worker, on
its record (``spent_tokens``).
Before each model call the step compares the spend with the budget; once the
spend reaches it the run parks with status ``budget_reached``: the step ends,
no worker and no lease holds it. The call in flight when the spend crossed the
budget finishes, so a run spends at most one call past its budget per call
running at that moment (one, when its calls run one after another).

``raise_budget`` sets the **new total** budget (not an increment: a repeated
call never adds more; once the run goes on it is refused, its budget no
longer reached; while a raise's parked members are still being moved on,
only the same total is accepted -- it finishes a raise that stopped half-way --
so a concurrent raise to another total is refused) and moves the run on from
where it stopped: a parked lead resumes (``lattice.resume_lead``), parked
members' messages go back to ``pending`` and their doorbells ring.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel, Field

from lattice_mailbox import InvalidTransitionError, MessageStatus

from .celery_config import DELIVER_TASK, RESUME_LEAD_TASK, queue_name
from .errors import RunNotFoundError
from .runstore import check_run_id
from .runstore.budgets import BudgetError, check_tokens


class RaisedBudget(BaseModel):
    """What :meth:`BudgetsMixin.raise_budget` did: the run's new budget
    (``budget_tokens``), the one before (``previous_tokens``), its spend
    (``spent_tokens``), and what was moved on: ``resumed_lead`` (the parked
    lead's resume was sent) and ``resumed_messages`` (members' message ids
    put back to ``pending``)."""

    run_id: str
    budget_tokens: int
    previous_tokens: int
    spent_tokens: int
    resumed_lead: bool = False
    resumed_messages: list[str] = Field(default_factory=list)


class BudgetWait(BaseModel):
    """Work waiting for its run's token budget to be raised (``client.budget_waits()``):
    the run's lead (``member`` ``"lead"``, ``message_id`` ``None``: the run is
    ``budget_reached``) or a member's message parked before its next model call
    (``message_id``, ``work_item_id``). ``spent_tokens`` / ``budget_tokens``: the
    run's now; ``created_at``: when it parked (ms since the epoch). Resume it
    with ``raise_budget(run_id, tokens=N)`` (``lattice budget RUN_ID --tokens N``)."""

    kind: Literal["budget"] = "budget"
    run_id: str
    team: str
    member: str
    message_id: str | None = None
    work_item_id: str | None = None
    spent_tokens: int
    budget_tokens: int
    reason: str = ""
    created_at: int = 0


def parse_budget(budget: Any) -> int | None:
    """The token count of a ``submit`` ``budget`` (``{"tokens": N}``, N a
    positive int), ``None`` for no budget. Raises ``ValueError`` otherwise."""
    if budget is None:
        return None
    if not isinstance(budget, dict) or set(budget) != {"tokens"}:
        raise ValueError(f'budget must be {{"tokens": N}} with N a positive integer, got {budget!r}')
    try:
        return check_tokens(budget["tokens"])
    except ValueError:
        raise ValueError(f"budget tokens must be a positive integer, got {budget['tokens']!r}") from None


class BudgetsMixin:
    """The budget API of :class:`~lattice_client.client.AsyncLatticeClient`
    (it gives ``runs``, ``mailbox``, ``celery`` and ``settings``)."""

    runs: Any
    mailbox: Any
    celery: Any
    settings: Any
    team_name: Callable[[str | None], Awaitable[str | None]]

    async def budget_waits(self, team: str | None = None) -> list[BudgetWait]:
        """The work waiting for a budget raise (of ``team`` when given: its name
        or a reference a live worker serves), oldest first: leads of
        ``budget_reached`` runs and members' messages parked at their run's
        budget (a member's wait is listed once its message is ``parked``: a
        raise then moves it on). Only reads; raises ``ValueError`` for a
        reference no live worker published, ``redis.RedisError`` when Redis
        fails."""
        team = await self.team_name(team)
        waits = [w for w in await self.runs.budget_waits() if team is None or w.get("team") == team]
        members = [w for w in waits if w.get("message_id")]
        messages = await asyncio.gather(*(self.mailbox.get(str(w["message_id"])) for w in members))
        moved = {
            id(w)
            for w, m in zip(members, messages, strict=True)
            if m is None or m.status != MessageStatus.PARKED
        }
        return [BudgetWait.model_validate(w) for w in waits if id(w) not in moved]

    async def raise_budget(self, run_id: str, *, tokens: int) -> RaisedBudget:
        """Set run ``run_id``'s token budget to ``tokens`` -- the new total, not
        an increment -- and resume what it parked (see the module doc).

        Accepted when the run is ``budget_reached``, or not finished with its
        spend at or over its budget. Raises ``ValueError`` for a malformed run
        id or a ``tokens`` that is not a positive int, :class:`RunNotFoundError`
        for an unknown run, :class:`~lattice_client.runstore.budgets.BudgetError`
        (a ``ValueError``) when the run is finished, has no budget, has not
        reached it, ``tokens`` is not above its spend, or its parked members
        are still being moved on by a raise to another total (a concurrent
        raise, or one that stopped half-way: repeat that total). Nothing
        changes then."""
        check_run_id(run_id)
        check_tokens(tokens)
        record = await self.runs.get(run_id)
        if record is None:
            raise RunNotFoundError(run_id)
        raised = await self.runs.raise_budget(run_id, tokens)
        prefix = self.settings.key_prefix
        sends: list[tuple[str, list[Any], str]] = []
        if raised.resume_lead:
            sends.append((RESUME_LEAD_TASK, [run_id], queue_name(prefix, record.team)))
        resumed: list[str] = []
        for wait in raised.waits:
            message_id, mailbox_id = wait.get("message_id"), wait.get("mailbox_id")
            try:
                message = await self.mailbox.get(message_id)
            except (TypeError, ValueError):
                message = None
            if message is not None and message.status == MessageStatus.PROCESSING:
                # its member ran the park script but has not parked the message yet:
                # the member sees the raise once it has, and moves it back itself
                # (the wait stays until then; a member that claims it again drops it)
                continue
            if message is not None and message.status == MessageStatus.PARKED:
                try:  # only while still parked: never release a claim a member took meanwhile
                    await self.mailbox.update_status(
                        message_id, MessageStatus.PENDING, only_from=MessageStatus.PARKED
                    )
                except InvalidTransitionError:  # moved on meanwhile (by a raise, or its member)
                    await self.runs.drop_budget_wait(run_id, str(wait.get("work_item_id")))
                    continue
                resumed.append(message_id)
                queue = queue_name(prefix, wait["team"], wait["member"])
                await asyncio.to_thread(
                    self.celery.send_task, DELIVER_TASK, args=[mailbox_id, message_id], queue=queue
                )
            # (a message pending or finished was moved on by an earlier raise)
            await self.runs.drop_budget_wait(run_id, str(wait.get("work_item_id")))
        for task, args, queue in sends:
            await asyncio.to_thread(self.celery.send_task, task, args=args, queue=queue)
        return RaisedBudget(
            run_id=run_id,
            budget_tokens=tokens,
            previous_tokens=raised.previous,
            spent_tokens=raised.spent,
            resumed_lead=raised.resume_lead,
            resumed_messages=resumed,
        )


class SyncBudgetsMixin:
    """The blocking form of :class:`BudgetsMixin` for :class:`~lattice_client.client.LatticeClient`."""

    aio: Any

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # LatticeClient's runs it on its loop thread

    def budget_waits(self, team: str | None = None) -> list[BudgetWait]:
        """See :meth:`BudgetsMixin.budget_waits`."""
        return self._call(self.aio.budget_waits, team)

    def raise_budget(self, run_id: str, *, tokens: int) -> RaisedBudget:
        """See :meth:`BudgetsMixin.raise_budget`."""
        return self._call(self.aio.raise_budget, run_id, tokens=tokens)


__all__ = ["BudgetError", "BudgetWait", "BudgetsMixin", "RaisedBudget", "SyncBudgetsMixin", "parse_budget"]
