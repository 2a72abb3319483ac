"""The lead session of a run: the team a run record names, and a fresh lead
agent over the run's persisted history with the member tools."""

from __future__ import annotations

import logging
from typing import Any

from lattice_client.models import RunRecord

from ...agent.agent import Agent
from ...agent.history_stores import RedisHistoryStore
from ...errors import ConfigError
from ...team.lead_tools import make_lead_member_tools
from ...team.member_tools import make_mailbox_tools
from ...team.team import Team
from ..limits.hook import step_model_client
from ..run.context import WorkerContext
from ..run.keys import RUN_KEY_TTL_SECONDS
from .dispatch import LeadTeamView, RunLinkingMailbox
from .lease import FencedHistoryStore, LeadLease

logger = logging.getLogger("lattice_worker.runtime")


def spawn_lead(
    ctx: WorkerContext,
    team: Team,
    run_id: str,
    *,
    lease: LeadLease | None = None,
    replay: dict[str, Any] | None = None,
    history: list[str] | None = None,
) -> Agent:
    """A fresh lead session for run ``run_id`` over its persisted history, with
    the member tools (and the mailbox tools when the team exposes them).

    ``lease``: the segment's lead lease; its history is then written only
    under it (:class:`~lattice_worker.runtime.lead.lease.FencedHistoryStore`, through
    ``ctx``'s writer: ``ctx.writer.sync(lease.token)`` writes what it queued).
    ``replay``: a persisted assistant message the first model request returns
    instead of calling the model (a recovering segment finishing the turn its
    dead predecessor started). ``history``: the persisted history's elements
    when the caller already read them (with ``lease`` only; spares the
    session's first read). Raises :class:`ConfigError` when the team's lead is
    not an ``AgentSpec``."""
    spec = team.lead_spec
    if spec is None:
        raise ConfigError(
            f'team "{team.name}": the lead must be an AgentSpec (define_agent) to run distributed'
        )
    store: RedisHistoryStore
    if lease is not None:
        store = FencedHistoryStore(
            lease,
            ctx.client,
            ctx.keys.history(run_id),
            ttl_seconds=RUN_KEY_TTL_SECONDS,
            history=history,
            writer=ctx.writer,
        )
    else:
        store = RedisHistoryStore(
            ctx.client, ctx.keys.history(run_id), fail_on_error=True, ttl_seconds=RUN_KEY_TTL_SECONDS
        )
    update: dict[str, Any] = {"history_store": store}
    client = step_model_client(
        ctx, spec.options, replay
    )  # the shared model rate limits (its own without them)
    if client is not spec.options.model_client:
        update["model_client"] = client
    options = spec.options.model_copy(update=update)
    agent = Agent(options, bare=options.workspace is False)
    tools = ctx.lead_tools.get(team.name)
    if tools is None:  # stateless (the dispatcher is the query's runtime): built once per team
        view = LeadTeamView(team, RunLinkingMailbox(team.mailbox, ctx.runs, ctx.writer, ctx.links, team.name))
        tools = make_lead_member_tools(view)  # type: ignore[arg-type]
        if team.expose_lead_mailbox_tools:
            tools += make_mailbox_tools()
        ctx.lead_tools[team.name] = tools
    agent.add_tools(tools)
    return agent


def team_for_run(ctx: WorkerContext, record: RunRecord) -> Team:
    """The rebound team of a run record, by its name, among the teams this
    worker was started with (and their nested teams). The record's
    ``team_ref`` is never imported. Raises
    :class:`~lattice_worker.errors.TeamNotServedError` (naming the
    team and this worker) when the worker does not serve it."""
    return ctx.registry.serving(record.team, ctx.worker_id)


__all__ = ["spawn_lead", "team_for_run"]
