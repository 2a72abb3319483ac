"""A run's token budget in the steps (issue 22; the client side is :mod:`lattice_client.budgets`).

The steps of a run with a budget (``budget_tokens`` on its record) run their
queries under a :class:`BudgetGate` (:data:`~lattice_worker.agent.call_gate.current_call_gate`):

* before each model call the run's spend is checked and the call's
  estimated tokens are reserved (``reserve_budget.lua``, one round trip:
  the estimate is the larger of the request's estimated input tokens and the
  run's largest call so far). A call that does not fit beside the calls in
  flight (spend + their reservations + its estimate over the budget) waits
  for them to land -- a re-check every :data:`WAIT_POLL_SECONDS`, bounded by
  the reservations' expiry (:data:`RESERVATION_SECONDS`, renewed every third
  of it while the call is in flight: a crashed worker's lapses) -- and emits one ``model_call_waiting`` event (``limit``
  ``"budget"``); only a call with none in flight may go past the budget. So
  a run spends at most one call past its budget with calls in parallel too
  (while no call is larger than its estimate);
* after each model call (in a ``finally``: a failed call too) its tokens (input, prompt-cache
  writes and reads, output: :func:`call_tokens`) are added to the run's ``spent_tokens`` and its reservation
  released in the same script (``spend_budget.lua``; queued, so it goes in
  the same round trip as the next write -- at the latest the next call's
  reservation -- or after the writer's linger);
* once the spend reaches the budget the step parks instead of calling
  (``SuspendQuery``):
  a lead segment, once its query ended, through ``park_budget_lead.lua``
  (the run becomes ``budget_reached``, its lease is dropped:
  :class:`LeadBudgetGate`, called by ``lead.segment.drive``), a
  member on a work item through ``park_budget_item.lua`` (its message
  becomes ``parked``: :class:`ItemBudgetGate`). Either emits a
  ``budget_reached`` event naming the budget and the spend.

The lead marks the task messages of a budgeted run (``metadata["lattice_budget"]``),
so a member step reads nothing more for runs without a budget. A member run
without a tool journal (a session member) counts its spend but finishes its
item; the lead parks before its next call. ``raise_budget`` moves parked
steps on (:mod:`lattice_client.budgets`).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from redis.exceptions import ResponseError

from lattice_client.errors import RunLeaseLostError
from lattice_client.runstore import now_ms
from lattice_client.runstore.budgets import budget_reply, reserve_reply
from lattice_mailbox.base import InvalidTransitionError
from lattice_mailbox.message import MessageStatus

from ...agent.model import TokenUsage
from ...agent.suspend import SuspendQuery
from .context import WorkerContext
from .estimate import estimate_input_tokens

logger = logging.getLogger("lattice_worker.runtime")

RESERVATION_SECONDS = 60.0
"""How long a model call's budget reservation holds unless renewed (every
third of it while the call is in flight): a crashed worker's lapses then."""

WAIT_POLL_SECONDS = 0.05
"""How often a call that waits for the calls in flight checks the budget again."""

BUDGET_METADATA_KEY = "lattice_budget"
"""Task-message metadata key the lead sets (``True``) when its run has a budget."""


def call_tokens(usage: Any) -> int:
    """Every token of one model call's ``usage`` (``TokenUsage``, dict or ``None``):
    input, prompt-cache writes (``cache_creation_input_tokens``), prompt-cache
    reads (``cache_read_input_tokens``) and output. Anthropic's ``input_tokens``
    leaves the cached part of a prompt out, and the estimate a call reserves
    covers its whole prompt, so the spend counts the cached part too
    (docs/operate.md, "Budgets")."""
    counted = TokenUsage.from_any(usage if isinstance(usage, TokenUsage | dict) else None)
    parts = (
        counted.input_tokens,
        counted.cache_creation_input_tokens,
        counted.cache_read_input_tokens,
        counted.output_tokens,
    )
    return sum(max(part, 0) for part in parts)


class BudgetGate:
    """Counts a step's model calls against run ``run_id``'s budget and checks
    it before each call (the :class:`~lattice_worker.agent.call_gate.CallGate`
    of the step's queries). This base class never parks (a step that cannot
    park: it counts only); :attr:`parked` is set by the subclasses."""

    def __init__(self, ctx: WorkerContext, run_id: str) -> None:
        self.ctx = ctx
        self.run_id = run_id
        self.parked: dict[str, Any] | None = None
        """``{"budget_tokens", "spent_tokens"}`` once this step parked on the budget."""
        self._renewals: dict[str, asyncio.Future[None]] = {}
        """The renewal task of each reservation of a call in flight."""
        self.stopped: str | None = None
        """Why the step's queries make no more calls (set when it stopped on the
        budget): every later call is refused at once -- a compaction summary
        swallows the ``SuspendQuery``, the query's next call must not park twice."""

    can_park = False
    """Whether :meth:`park` may park the step (the base class counts only)."""

    async def before_call(self, request: Any = None) -> str:
        """Check the budget and reserve the call (see the module doc): returns
        the reservation (``""``: none) for :meth:`after_call`; raises
        ``SuspendQuery`` once the step parked."""
        if self.stopped is not None:  # a call after the stop (a summary swallowed its SuspendQuery)
            raise SuspendQuery(self.stopped)
        estimate = estimate_input_tokens(request) if request is not None else 0
        call_id = uuid.uuid4().hex
        waiting = False
        while True:
            call, source = self.ctx.runs.reserve_call(
                self.run_id, call_id, estimate, int(RESERVATION_SECONDS * 1000)
            )
            try:
                replies = await self.ctx.writer.write([call], scripts=(source,))
            except ResponseError as exc:
                if str(exc).startswith("NORUN"):
                    return ""  # deleted: the step finds out at its next write
                raise
            outcome, spent, budget, detail = reserve_reply(replies[0])
            if outcome == "go":
                if detail:
                    self._renewals[str(detail)] = asyncio.ensure_future(self._renew(str(detail)))
                return str(detail)
            if outcome == "wait":
                if not waiting:
                    waiting = True
                    await self._waiting(spent, budget)
                await asyncio.sleep(min(WAIT_POLL_SECONDS, int(detail) / 1000))
                continue
            if await self.park(spent, budget):
                self.stopped = f"run {self.run_id} reached its budget ({spent} of {budget} tokens)"
                raise SuspendQuery(self.stopped)
            if not self.can_park:
                return ""  # a step that cannot park goes on (it counts only)
            # raised meanwhile: check again

    async def after_call(self, usage: Any, ticket: Any = "") -> None:
        """Count the call's tokens and release its reservation ``ticket``:
        queued (it goes with the step's next write, at the latest after the
        writer's linger; a failure is logged and the reservation lapses at
        its expiry). Its renewal stops first (a renewal already queued is
        written before the release)."""
        renewal = self._renewals.pop(str(ticket), None) if ticket else None
        if renewal is not None:
            renewal.cancel()
        tokens = call_tokens(usage)
        if tokens <= 0 and not ticket:
            return
        call, source = self.ctx.runs.spend_call(self.run_id, tokens, str(ticket or ""))
        self.ctx.writer.queue_write([call], scripts=(source,))

    async def _renew(self, reservation: str) -> None:
        """Renew ``reservation`` every third of :data:`RESERVATION_SECONDS`
        until :meth:`after_call` stops it (a failed renewal is logged: the
        next one tries again)."""
        hold_ms = int(RESERVATION_SECONDS * 1000)
        while True:
            await asyncio.sleep(RESERVATION_SECONDS / 3)
            call, source = self.ctx.runs.renew_call(self.run_id, reservation, hold_ms)
            try:
                await self.ctx.writer.write([call], scripts=(source,))
            except Exception:  # noqa: BLE001 - the call goes on; the next renewal tries again
                logger.warning("run %s: renewing a budget reservation failed", self.run_id, exc_info=True)

    async def _waiting(self, spent: int, budget: int) -> None:
        await self.ctx.events.emit(
            self.run_id,
            {
                "type": "model_call_waiting",
                "limit": "budget",
                "run_id": self.run_id,
                "budget": {"tokens": budget},
                "spent_tokens": spent,
            },
        )
        logger.info(
            "run %s: a model call waits for the calls in flight (%d of %d tokens spent)",
            self.run_id,
            spent,
            budget,
        )

    async def park(self, spent: int, budget: int) -> bool:
        """Park the step (the spend reached the budget); False: it goes on."""
        return False

    async def _parked(self, spent: int, budget: int, **extra: Any) -> None:
        self.parked = {"budget_tokens": budget, "spent_tokens": spent}
        await self.ctx.events.emit(
            self.run_id,
            {
                "type": "run_status",
                "status": "budget_reached",
                "run_id": self.run_id,
                "budget": {"tokens": budget},
                "spent_tokens": spent,
                **extra,
            },
        )
        logger.info("run %s reached its budget (%d of %d tokens): parked", self.run_id, spent, budget)


class LeadBudgetGate(BudgetGate):
    """The gate of a lead segment under ``lease`` (a
    :class:`~lattice_worker.runtime.lead.lease.LeadLease`). A reached budget
    stops the lead's query before the call; the segment then parks the run
    (:meth:`park_segment`: ``budget_reached``, the lease dropped) once the
    query has ended -- not from inside it, where a tool batch may still
    register its work items under the lease (a compaction summary between
    the batch and its registration is a call too)."""

    def __init__(self, ctx: WorkerContext, run_id: str, lease: Any) -> None:
        super().__init__(ctx, run_id)
        self.lease = lease

    can_park = True

    async def park(self, spent: int, budget: int) -> bool:
        return True  # the query stops; park_segment writes the park after it

    async def park_segment(self, final: Any, usage: dict[str, int] | None) -> str | None:
        """After the query the gate stopped: count its usage (the run's usage
        hash, as a suspension does), park the run and say so
        (``"budget_reached"``), or ``None`` when the budget was raised
        meanwhile (the run stays running: the lead goes on). Raises
        ``RunLeaseLostError`` when the lease was lost (nothing written)."""
        lease = self.lease

        def failed(exc: BaseException) -> BaseException:
            error = self.ctx.runs.script_error(exc, self.run_id, "park_budget_lead")
            if isinstance(error, RunLeaseLostError):
                lease.mark_lost()
            return error

        await self.ctx.usage.add(self.run_id, getattr(final, "usage", None), known=usage, fence=lease.token)
        call, source = self.ctx.runs.park_budget_lead_call(self.run_id, lease.token)
        # the queued usage, history and events go first, in the same round trip; the run
        # joins the waits' listing index (lattice parked / status list what it parked)
        index = self.ctx.runs.index_wait_command(self.run_id)
        replies = await self.ctx.writer.write([call, index], scripts=(source,), on_error=failed)
        parked, spent, budget = (int(v) for v in replies[0])
        await self.ctx.writer.sync(lease.token)  # a failed history write of the segment is raised here
        if not parked:
            return None
        lease.end()  # the run is parked: renewals stop quietly
        self.ctx.writer.queue_write([("zrem", self.ctx.runs.leases_key, self.run_id)])
        await self._parked(spent, budget, member="lead")
        return "budget_reached"


class ItemBudgetGate(BudgetGate):
    """The gate of a member step on a work item, with its ``journal`` (an
    :class:`~lattice_worker.runtime.run.journal.ItemJournal`): parking puts
    the item in the run's budget waits and its message to ``parked`` (the
    work item stays open), and sets ``journal.waiting`` (kind ``"budget"``)
    so the step ends as parked."""

    def __init__(self, ctx: WorkerContext, run_id: str, journal: Any) -> None:
        super().__init__(ctx, run_id)
        self.journal = journal
        # a budget wait of this item left from an earlier park is over: its message
        # was claimed again (queued: it goes before this step's first check)
        ctx.writer.queue_write([("hdel", ctx.runs.budget_waits_key(run_id), journal.work_item_id)])

    can_park = True

    async def park(self, spent: int, budget: int) -> bool:
        journal = self.journal
        message = journal.message
        current = await self.ctx.mailbox.get(message.id)
        if current is None or current.status != MessageStatus.PROCESSING:
            # the member closed its message already (team_reply): the item is
            # answered; the query stops without the call and the item ends as it is
            return True
        wait = {
            "kind": "budget",
            "id": message.id,
            "run_id": self.run_id,
            "team": journal.team,
            "member": journal.member,
            "message_id": message.id,
            "mailbox_id": message.to,
            "work_item_id": journal.work_item_id,
            "reason": f"the run's budget is spent ({spent} of {budget} tokens)",
            "created_at": now_ms(),
        }
        call, source = self.ctx.runs.park_budget_item_call(self.run_id, journal.work_item_id, wait)
        # the item's queued history goes first, in the same round trip; the run joins the
        # waits' listing index (lattice parked / status list what it parked)
        replies = await self.ctx.writer.write(
            [call, self.ctx.runs.index_wait_command(self.run_id)],
            scripts=(source,),
            on_error=lambda e: self.ctx.runs.script_error(e, self.run_id, "park"),
        )
        parked, spent, budget = (int(v) for v in replies[0])
        await self.ctx.writer.sync(journal.token)
        if not parked:
            return False
        await self.ctx.mailbox.complete(message.id, journal.token, "parked")
        journal.waiting = wait
        await self._parked(spent, budget, member=journal.member, message_id=message.id)
        await self._raised_meanwhile()
        return True

    async def _raised_meanwhile(self) -> None:
        """A raise that ran between the park script and the message's park
        found the message still processing and left it (and its wait) to this
        step: once the budget is no longer reached, move the parked message
        back to ``pending``, ring its doorbell and drop the wait, as the raise does."""
        replies = await self.ctx.writer.write([self.ctx.runs.budget_read_command(self.run_id)])
        budget, spent = budget_reply(replies[0])
        if budget is not None and spent >= budget:
            return  # still reached: a later raise moves it on
        message = self.journal.message
        current = await self.ctx.mailbox.get(message.id)
        if current is not None and current.status == MessageStatus.PARKED:
            try:  # only while still parked: a raise may have moved it on and a worker claimed it
                await self.ctx.mailbox.update_status(
                    message.id, MessageStatus.PENDING, only_from=MessageStatus.PARKED
                )
            except InvalidTransitionError:
                pass
            else:
                self.ctx.steps.ring(message.to, message.id)
                logger.info(
                    "run %s: its budget was raised while %s parked; moved back", self.run_id, message.id
                )
        await self.ctx.writer.write(
            [("hdel", self.ctx.runs.budget_waits_key(self.run_id), self.journal.work_item_id)]
        )


async def with_team_budget(ctx: WorkerContext, team: Any, record: Any) -> Any:
    """``record`` with its team's default budget (``create_team(budget=...)``)
    applied when it has none of its own (written to the run record; the first
    segment of a run does it). ``record`` itself when nothing applies."""
    tokens = getattr(team, "budget_tokens", None)
    if tokens is None or record.budget_tokens is not None:
        return record
    call, source = ctx.runs.default_budget_call(record.run_id, tokens)
    [budget] = await ctx.writer.write([call], scripts=(source,))
    if not int(budget):
        return record  # deleted meanwhile: the segment finds out at its next write
    return record.model_copy(update={"budget_tokens": int(budget), "spent_tokens": record.spent_tokens or 0})


def lead_gate(ctx: WorkerContext, record: Any, lease: Any) -> LeadBudgetGate | None:
    """The gate of a lead segment of ``record`` (``None``: the run has no budget, or no lease)."""
    if lease is None or getattr(record, "budget_tokens", None) is None:
        return None
    return LeadBudgetGate(ctx, record.run_id, lease)


def member_gate(ctx: WorkerContext, run_id: str | None, message: Any, journal: Any) -> BudgetGate | None:
    """The gate of a member step on ``message`` of run ``run_id`` (``None``:
    not a budgeted run's task message). Without a ``journal`` it counts only."""
    if not run_id or not (message.metadata or {}).get(BUDGET_METADATA_KEY):
        return None
    if journal is None:
        return BudgetGate(ctx, run_id)
    return ItemBudgetGate(ctx, run_id, journal)


__all__ = [
    "BUDGET_METADATA_KEY",
    "RESERVATION_SECONDS",
    "WAIT_POLL_SECONDS",
    "BudgetGate",
    "ItemBudgetGate",
    "LeadBudgetGate",
    "call_tokens",
    "lead_gate",
    "member_gate",
    "with_team_budget",
]
