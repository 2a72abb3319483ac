"""What :class:`~lattice_client.client.AsyncLatticeClient` shows of a deployment:
``status`` (mailbox counts, recent runs, live workers, calls waiting for a
person, model calls waiting for their turn, work waiting for a budget raise), the known mailboxes and teams, and a mailbox's messages (``inbox``).

:class:`ViewsMixin` reads through the client's ``runs`` and ``mailbox`` and its
``live_workers`` / ``registered_teams`` (:mod:`lattice_client.submit`) and
``parked`` / ``approvals`` (:mod:`lattice_client.decisions`) and
``budget_waits`` (:mod:`lattice_client.budgets`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import BaseModel, Field

from lattice_mailbox import MessageStatus, TeamMessage
from lattice_mailbox.connections import read_again

from .budgets import BudgetWait
from .decisions import ParkedCall, PendingApproval
from .models import RunRecord
from .rate_limits import WaitingModelCalls, waiting_calls
from .registry import LiveRegistry, WorkerInfo, check_team_ref
from .submit import _unserved_message


class StatusReport(BaseModel):
    """Mailbox counts and recent runs, as :meth:`AsyncLatticeClient.status` returns them.

    ``mailboxes``: mailbox id -> {status value -> number of messages};
    ``runs``: the most recent runs, newest first; ``workers``: the live
    workers (of ``team`` when given), see :class:`~lattice_client.registry.WorkerInfo`;
    ``parked`` / ``approvals``: the tool calls waiting for a person (oldest first);
    ``rate_limited``: the model calls waiting for their turn under the shared
    rate limits, per model and API key id, with the limit that made them wait
    (:class:`~lattice_client.rate_limits.WaitingModelCalls`; deployment-wide,
    also with ``team``); ``budget_waits``: the work waiting for its run's token
    budget to be raised (:class:`~lattice_client.budgets.BudgetWait`, oldest first).
    """

    team: str | None = None
    mailboxes: dict[str, dict[str, int]] = Field(default_factory=dict)
    runs: list[RunRecord] = Field(default_factory=list)
    workers: list[WorkerInfo] = Field(default_factory=list)
    parked: list[ParkedCall] = Field(default_factory=list)
    approvals: list[PendingApproval] = Field(default_factory=list)
    rate_limited: list[WaitingModelCalls] = Field(default_factory=list)
    budget_waits: list[BudgetWait] = Field(default_factory=list)


class ViewsMixin:
    """The status and inbox views of :class:`~lattice_client.client.AsyncLatticeClient`
    (it gives ``runs``, ``mailbox``, ``settings``, ``live_workers``,
    ``registered_teams``, ``parked`` and ``approvals``)."""

    runs: Any
    mailbox: Any
    settings: Any
    live_workers: Callable[[], Awaitable[list[WorkerInfo]]]
    registered_teams: Callable[[], Awaitable[dict[str, str]]]
    parked: Callable[[str | None], Awaitable[list[ParkedCall]]]
    approvals: Callable[[str | None], Awaitable[list[PendingApproval]]]
    budget_waits: Callable[[str | None], Awaitable[list[BudgetWait]]]

    async def status(self, team: str | None = None, *, limit: int = 20) -> StatusReport:
        """Per-status message counts of every ``<team>::*`` mailbox (every mailbox
        when ``team`` is ``None``), the ``limit`` most recent runs, the live
        workers (those serving ``team`` when given), the tool calls waiting
        for a person, the model calls waiting for their turn and the work
        waiting for a budget raise. ``team`` may also be a ``"package.module:attribute"``
        reference a live worker serves (see
        :meth:`resolve_team`). Only reads: read again whole when a connection
        is lost mid-way."""
        return await read_again(lambda: self._status(team, limit))

    async def team_name(self, team: str | None, workers: list[WorkerInfo] | None = None) -> str | None:
        """The team name that ``team`` stands for: a ``"package.module:attribute"``
        reference becomes the name a live worker published for it (``workers``:
        the live workers, read when not given); a name (or ``None``) is returned
        as it is. Raises ``ValueError`` for a malformed reference or one no live
        worker published, ``TypeError`` when ``team`` is not a str."""
        if team is not None and not isinstance(team, str):
            raise TypeError(f"team must be a team name or reference (a str), not {type(team).__name__}")
        if not team or ":" not in team or "::" in team:
            return team
        live = LiveRegistry(workers if workers is not None else await self.live_workers())
        name = live.resolve(check_team_ref(team))
        if name is None:
            raise ValueError(_unserved_message(team, self.settings.key_prefix, live, is_ref=True))
        return name

    async def _status(self, team: str | None, limit: int) -> StatusReport:
        workers = await self.live_workers()
        team = await self.team_name(team, workers)
        prefix = f"{team}::" if team else None
        mailbox = self.mailbox
        ids = await mailbox.mailbox_ids(prefix)
        counts = {mailbox_id: await mailbox.counts(mailbox_id) for mailbox_id in ids}
        runs = await self.runs.list_runs(team, limit=limit)
        if team:
            workers = [w for w in workers if team in w.team_names()]
        parked, approvals = await self.parked(team), await self.approvals(team)
        rate_limited = await self._rate_limited()
        return StatusReport(
            team=team,
            mailboxes=counts,
            runs=runs,
            workers=workers,
            parked=parked,
            approvals=approvals,
            rate_limited=rate_limited,
            budget_waits=await self.budget_waits(team),
        )

    async def rate_limited(self) -> list[WaitingModelCalls]:
        """The model calls waiting for their turn under the shared rate limits
        now, one entry per (model, API key) with calls waiting (deployment-wide;
        ``[]`` without ``LATTICE_MODEL_LIMITS``): how many, the longest wait
        left in seconds and the limit that made them wait (see
        :class:`~lattice_client.rate_limits.WaitingModelCalls`). Only reads;
        raises ``redis.RedisError`` when Redis fails."""
        return await read_again(self._rate_limited)

    async def _rate_limited(self) -> list[WaitingModelCalls]:
        return await waiting_calls(await self.runs.redis(), self.settings.key_prefix)

    async def known_mailboxes(self, team: str | None = None) -> list[str]:
        """Ids of the mailboxes that ever received a message, and of the members
        of the teams live workers serve (see :class:`~lattice_client.registry.WorkerInfo`),
        sorted; of ``team``'s mailboxes only, when given."""
        prefix = f"{team}::" if team else None
        stored = set(await self.mailbox.mailbox_ids(prefix))
        served = LiveRegistry(await self.live_workers()).mailbox_ids()
        return sorted(stored | {box for box in served if prefix is None or box.startswith(prefix)})

    async def known_teams(self) -> list[str]:
        """Team names this deployment knows, sorted: those a worker registered
        and those with mailboxes."""
        names = set((await self.registered_teams()).values())
        names |= {box.partition("::")[0] for box in await self.known_mailboxes()}
        return sorted(names)

    async def team_exists(self, team: str) -> bool:
        """Whether ``team`` (a name) is registered, has mailboxes or has runs."""
        if team in (await self.registered_teams()).values():
            return True
        if await self.known_mailboxes(team):
            return True
        return bool(await self.runs.list_runs(team, limit=1))

    async def inbox(self, mailbox_id: str, status: MessageStatus | str = "pending") -> list[TeamMessage]:
        """Messages of one mailbox (``"<team>::<member>"``) with ``status`` (a
        :class:`MessageStatus` value or ``"all"``), oldest first. Raises
        ``ValueError`` for an unknown status."""
        if status != "all":
            status = MessageStatus.parse(status)
        return await read_again(lambda: self.mailbox.inbox(mailbox_id, status))


__all__ = ["StatusReport", "ViewsMixin"]
