"""A template member's attempt at a work item, journaled (``docs/tool-effects.md``).

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
from ..limits.hook import limited_client
from ..run.context import WorkerContext
from ..run.journal import ItemHistoryStore, ItemJournal, decode_history
from ..run.replay import ReplayModelClient, encode_message


async def journaled_member(
    ctx: WorkerContext, team_name: str, member: TeamMember, message: TeamMessage, run_id: str
) -> tuple[Agent, ItemJournal, bool]:
    """``(agent, journal, resume)`` for ``member`` (an ``AgentSpec`` member) on the
    claimed ``message`` of run ``run_id``. ``resume``: the history holds this
    item's conversation already (continue it). Raises ``RunLeaseLostError`` when a
    later claim of the item already began (this attempt must write nothing)."""
    journal = ItemJournal(ctx, run_id, team_name, member.name, message)
    elements: list[str] = []
    if message.attempts > 1:
        command, source = ctx.runs.begin_item_call(
            run_id, journal.work_item_id, journal.attempts, journal.token
        )
        replies = await ctx.writer.write([command], scripts=(source,), on_error=journal._failed("begin_item"))
        elements, journal.records = ctx.runs.begin_item_reply(replies[0])
    messages = decode_history(elements)
    replay: dict[str, Any] | None = None
    if messages and messages[-1].get("role") == "assistant":
        replay = messages.pop()
    store = ItemHistoryStore(
        journal, history=[encode_message(m, "history").decode("utf-8") for m in messages]
    )
    if replay is not None:
        await store.replace(messages)  # the replayed turn is stored again as the model "returns" it
    spec = member.agent
    update: dict[str, Any] = {"history_store": store}
    client = limited_client(ctx, spec.options)  # the shared model rate limits (its own without them)
    if client is not spec.options.model_client:
        update["model_client"] = client
    if replay is not None:
        update["model_client"] = ReplayModelClient(
            replay, client, api_key=spec.options.api_key, base_url=spec.options.base_url
        )
    options = spec.options.model_copy(update=update)
    return Agent(options, bare=options.workspace is False), journal, bool(messages)


__all__ = ["journaled_member"]
