"""A session member's agent for one claimed message (a live ``Agent`` member: serial per mailbox).

Its conversation is the mailbox's, kept across work items in Redis
(``<prefix>:session:<mailbox id>``, :func:`session_agent`). In a distributed
run its tool calls go through the work item's
:class:`~lattice_worker.runtime.run.journal.ItemJournal` as a template
member's do (``docs/tool-effects.md``; :func:`journaled_session`): the
assistant turn holding a call is appended to the conversation before the
call's ``started`` record is stored, and that record before the handler runs.
A later claim of the item -- after a crash, a park or an approval -- finds
this item's task prompt in the conversation (the last user message equal to
:func:`~lattice_worker.team.member_run.member_prompt` of the message, which
names the message id) and resumes after it: an assistant turn last is
*replayed* (:class:`~lattice_worker.runtime.run.replay.ReplayModelClient`), so
its calls run through the journal -- completed ones reused, interrupted ones
decided by their effect. A conversation without that prompt (the item never
got to it, or a compaction summarised it away) starts the item over.
"""

from __future__ import annotations

from typing import Any

from lattice_mailbox.message import TeamMessage

from ...agent.agent import Agent
from ...agent.history_stores import RedisHistoryStore
from ...team.member import TeamMember
from ...team.member_run import member_prompt
from ..limits.hook import step_model_client
from ..run.context import WorkerContext
from ..run.journal import ItemJournal
from .journal import begin_attempt, split_replay


def session_agent(
    ctx: WorkerContext, member: TeamMember, mailbox_id: str, *, replay: dict[str, Any] | None = None
) -> Agent:
    """A session member's ``Agent`` rebuilt over its persisted conversation
    (Redis list ``<prefix>:session:<mailbox_id>``), with the member's tools
    (mailbox tools included). ``replay``: an assistant turn its first model
    request returns (a resumed item). Other options are the member agent's own."""
    base: Agent = member.agent
    store = RedisHistoryStore(ctx.client, ctx.keys.session(mailbox_id), fail_on_error=True)
    update: dict[str, Any] = {"history_store": store, "tools": list(base.tools)}
    client = step_model_client(
        ctx, base.options, replay
    )  # under the shared limits it waits in place (serial mailbox)
    if client is not base.options.model_client:
        update["model_client"] = client
    options = base.options.model_copy(update=update)
    return Agent(options, bare=base.bare)


async def journaled_session(
    ctx: WorkerContext, team_name: str, member: TeamMember, message: TeamMessage, run_id: str
) -> tuple[Agent, ItemJournal, bool]:
    """``(agent, journal, resume)`` for session ``member`` on the claimed
    ``message`` of run ``run_id`` (see the module doc). ``resume``: the
    conversation holds this item's prompt already (continue it). Raises
    ``RunLeaseLostError`` when a later claim of the item already began (this
    attempt must write nothing)."""
    journal, _ = await begin_attempt(ctx, team_name, member, message, run_id)
    if message.attempts <= 1:  # a first claim: the item starts here
        return session_agent(ctx, member, message.to), journal, False
    store = RedisHistoryStore(ctx.client, ctx.keys.session(message.to), fail_on_error=True)
    history = await store.load()
    prompt = member_prompt(team_name, member, message)
    if not any(m.get("role") == "user" and m.get("content") == prompt for m in history):
        return session_agent(ctx, member, message.to), journal, False
    history, replay = split_replay(history)
    if replay is not None:
        await store.replace(history)  # the replayed turn is stored again as the model "returns" it
    return session_agent(ctx, member, message.to, replay=replay), journal, True


__all__ = ["journaled_session", "session_agent"]
