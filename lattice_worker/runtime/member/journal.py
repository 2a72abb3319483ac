"""A template member's attempt at a work item, journaled (``docs/tool-effects.md``;
a session member's: :mod:`lattice_worker.runtime.member.session`).

:func:`journaled_member` builds the member's session for one claimed message
of a distributed run: its history is the work item's (persisted as the member
works, under the claim), its tool calls go through the item's
:class:`~lattice_worker.runtime.run.journal.ItemJournal`. A first claim
starts from nothing (no read). A later claim -- after a crash, a park or an
approval -- reads what the earlier attempts persisted (``begin_item``, one
round trip) and resumes from the last recorded turn: an assistant turn whose
tool batch was interrupted is *replayed* (the first model request returns it,
:class:`~lattice_worker.runtime.lead.lease.ReplayModelClient`), so its calls
run through the journal -- completed ones reused, interrupted ones decided
by their effect.
"""

from __future__ import annotations

from typing import Any

from lattice_mailbox.message import TeamMessage

from ...agent.agent import Agent
from ...team.member import TeamMember
from ..limits.hook import step_model_client
from ..run.context import WorkerContext
from ..run.journal import ItemHistoryStore, ItemJournal, decode_history
from ..run.replay import encode_message


async def journaled_member(
    ctx: WorkerContext, team_name: str, member: TeamMember, message: TeamMessage, run_id: str
) -> tuple[Agent, ItemJournal, bool]:
    """``(agent, journal, resume)`` for ``member`` (an ``AgentSpec`` member) on the
    claimed ``message`` of run ``run_id``. ``resume``: the history holds this
    item's conversation already (continue it). Raises ``RunLeaseLostError`` when a
    later claim of the item already began (this attempt must write nothing)."""
    journal, elements = await begin_attempt(ctx, team_name, member, message, run_id)
    messages, replay = split_replay(decode_history(elements))
    store = ItemHistoryStore(
        journal, history=[encode_message(m, "history").decode("utf-8") for m in messages]
    )
    if replay is not None:
        store.hold(messages, replay)  # stored until the model "returns" it (a park first leaves it)
    spec = member.agent
    update: dict[str, Any] = {"history_store": store}
    client = step_model_client(
        ctx, spec.options, replay
    )  # the shared model rate limits (its own without them)
    if client is not spec.options.model_client:
        update["model_client"] = client
    options = spec.options.model_copy(update=update)
    return Agent(options, bare=options.workspace is False), journal, bool(messages)


async def begin_attempt(
    ctx: WorkerContext, team_name: str, member: TeamMember, message: TeamMessage, run_id: str
) -> tuple[ItemJournal, list[str]]:
    """The journal of this claim of ``message`` and the item history elements
    (JSON text) the earlier attempts persisted. A first claim reads nothing; a
    later one reads them with the journal's records (``begin_item``, one round
    trip), which raises ``RunLeaseLostError`` when a later claim already began."""
    journal = ItemJournal(ctx, run_id, team_name, member.name, message)
    elements: list[str] = []
    if message.attempts > 1:
        command, source = ctx.runs.begin_item_call(
            run_id, journal.work_item_id, journal.attempts, journal.token
        )
        replies = await ctx.writer.write([command], scripts=(source,), on_error=journal._failed("begin_item"))
        elements, journal.records = ctx.runs.begin_item_reply(replies[0])
    return journal, elements


def split_replay(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``(history, replay)``: an assistant turn that ends ``messages`` is taken
    off to be replayed (its tool batch was interrupted, or it ended the work);
    ``replay`` is ``None`` otherwise."""
    if messages and messages[-1].get("role") == "assistant":
        return messages[:-1], messages[-1]
    return messages, None


__all__ = ["begin_attempt", "journaled_member", "split_replay"]
