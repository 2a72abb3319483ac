"""A session member's agent for one claimed message (a live ``Agent`` member: serial per mailbox).

Its conversation is the mailbox's, kept across work items in Redis
(``<prefix>:session:<mailbox id>``, :func:`session_agent`). In a distributed
run its tool calls go through the work item's
:class:`~lattice_worker.runtime.run.journal.ItemJournal` as a template
member's do (``docs/tool-effects.md``; :func:`journaled_session`): the
assistant turn holding a call is appended to the conversation before the
call's ``started`` record is stored, and that record before the handler runs.
A later claim of the item -- after a crash, a park or an approval -- finds
this item's task prompt in the conversation (equal to
:func:`~lattice_worker.team.member_run.member_prompt` of the message, which
names the message id) as its *last* prompt and resumes after it: an
assistant turn last is *replayed*
(:class:`~lattice_worker.runtime.run.replay.ReplayModelClient`), so its calls
run through the journal -- completed ones reused, interrupted ones decided by
their effect. A conversation whose last prompt is another one (the item
never got to its prompt, a compaction summarised it away, or another item of
the mailbox was claimed first -- a doorbell naming that message -- and went on
after it) starts the item over.

Each claim takes the conversation first
(:func:`~lattice_worker.runtime.member.session_history.take_session`): a
worker whose claim was taken over writes nothing more to it.

An item that starts (over) on a conversation ending with an assistant turn
whose tool calls have no results (an item that was interrupted there and
then cancelled, failed or set aside) first answers those calls with an error
result (:data:`INTERRUPTED_RESULT`): a request whose ``tool_use`` blocks are
not answered in the next message is refused by the provider, and every later
item of the session would fail on it.
"""

from __future__ import annotations

import json
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
from .session_history import take_session

INTERRUPTED_RESULT = (
    "Error: this call was interrupted and its result is unknown (it may or may not have taken effect); "
    "the work item it belonged to was set aside."
)
"""The content of the error result that answers a call left without one (module doc)."""


def session_agent(
    ctx: WorkerContext,
    member: TeamMember,
    mailbox_id: str,
    *,
    replay: dict[str, Any] | None = None,
    store: RedisHistoryStore | None = None,
) -> Agent:
    """A session member's ``Agent`` rebuilt over its persisted conversation
    (Redis list ``<prefix>:session:<mailbox_id>``; ``store``: the store over
    it, a plain :class:`RedisHistoryStore` when ``None``), with the member's
    tools (mailbox tools included). ``replay``: an assistant turn its first
    model request returns (a resumed item). Other options are the member agent's own."""
    base: Agent = member.agent
    if store is None:
        store = RedisHistoryStore(ctx.client, ctx.keys.session(mailbox_id), fail_on_error=True)
    update: dict[str, Any] = {"history_store": store, "tools": list(base.tools)}
    client = step_model_client(
        ctx, base.options, replay
    )  # under the shared limits it waits in place (serial mailbox)
    if client is not base.options.model_client:
        update["model_client"] = client
    options = base.options.model_copy(update=update)
    return Agent(options, bare=base.bare)


async def unjournaled_session(
    ctx: WorkerContext, member: TeamMember, message: TeamMessage, run_id: str | None
) -> Agent:
    """:func:`session_agent` for an item that is not journaled (no work item,
    or ``LATTICE_TOOL_JOURNAL=false``): it starts (over) here, after
    :func:`close_interrupted`. A claimed ``message`` takes the conversation
    first (:func:`~.session_history.take_session`), so a worker that loses
    this claim writes nothing more to it. Raises ``RunLeaseLostError`` when a
    later claim of the mailbox took it already (this attempt must write nothing)."""
    if not message.claim_token:
        store = RedisHistoryStore(ctx.client, ctx.keys.session(message.to), fail_on_error=True)
        await close_interrupted(store)
        return session_agent(ctx, member, message.to, store=store)
    fenced, last = await take_session(ctx, message, run_id or "", read_all=False)
    await close_interrupted(fenced, last)
    return session_agent(ctx, member, message.to, store=fenced)


async def journaled_session(
    ctx: WorkerContext, team_name: str, member: TeamMember, message: TeamMessage, run_id: str
) -> tuple[Agent, ItemJournal, bool]:
    """``(agent, journal, resume)`` for session ``member`` on the claimed
    ``message`` of run ``run_id`` (see the module doc), its conversation
    taken for this claim (:func:`~.session_history.take_session`: written only
    until a later claim takes it). ``resume``: the conversation's last prompt
    is this item's (continue it). Raises ``RunLeaseLostError`` when a later
    claim of the item, or of the mailbox, already began (this attempt must
    write nothing)."""
    journal, _ = await begin_attempt(ctx, team_name, member, message, run_id)
    again = message.attempts > 1
    store, history = await take_session(ctx, message, run_id, read_all=again)
    if not again:  # a first claim: the item starts here
        await close_interrupted(store, history)
        return session_agent(ctx, member, message.to, store=store), journal, False
    if not _last_prompt_is(history, member_prompt(team_name, member, message)):
        await close_interrupted(store, history[-1:])
        return session_agent(ctx, member, message.to, store=store), journal, False
    history, replay = split_replay(history)
    if replay is not None:
        store.hold(history, replay)  # stored until the model "returns" it (a park first leaves it)
    return session_agent(ctx, member, message.to, replay=replay, store=store), journal, True


async def close_interrupted(store: RedisHistoryStore, last: list[dict[str, Any]] | None = None) -> None:
    """Answer the tool calls of an assistant turn that ends the session's
    conversation (``store``) with an :data:`INTERRUPTED_RESULT` error result
    each (see the module doc), before an item's prompt is appended. ``last``:
    the conversation's last message (``[]`` when empty) if already read; else
    it is read (one ``LINDEX``). Raises Redis errors and the store's."""
    if last is None:
        raw = await store._redis().lindex(store.key, -1)
        last = [json.loads(raw)] if raw is not None else []
    message = last[-1] if last else None
    if not isinstance(message, dict) or message.get("role") != "assistant":
        return
    content = message.get("content")
    calls = (
        [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
        if isinstance(content, list)
        else []
    )
    if not calls:
        return
    results = [
        {
            "type": "tool_result",
            "tool_use_id": str(b.get("id", "")),
            "content": INTERRUPTED_RESULT,
            "is_error": True,
        }
        for b in calls
    ]
    await store.append({"role": "user", "content": results})


def _is_prompt(message: dict[str, Any]) -> bool:
    """A user message that is not (only) tool results: a prompt."""
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if not isinstance(content, list):
        return True
    return any(not isinstance(b, dict) or b.get("type") != "tool_result" for b in content)


def _last_prompt_is(history: list[dict[str, Any]], prompt: str) -> bool:
    last = next((m for m in reversed(history) if _is_prompt(m)), None)
    return last is not None and last.get("content") == prompt


__all__ = [
    "INTERRUPTED_RESULT",
    "close_interrupted",
    "journaled_session",
    "session_agent",
    "unjournaled_session",
]
