"""A session member's conversation across its work items stays one the
provider accepts, and a re-claimed item goes on only from its own turns
(``lattice_worker.runtime.member.session``; docs/tool-effects.md), in-process
against the real Redis with the harness of ``test_tool_effects_protocol``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from lattice_client.celery_config import DELIVER_TASK
from lattice_client.errors import RunLeaseLostError
from lattice_worker.runtime.member.session import INTERRUPTED_RESULT
from lattice_worker.runtime.member.session_history import take_session
from tests.e2e import effect_teams
from tests.e2e.effect_teams import member_plan
from tests.integration import test_tool_effects_protocol as protocol
from tests.integration.test_tool_effects_protocol import (
    Env,
    count,
    park_session_email,
    result_of,
    session_key,
    session_of,
    start_member,
    submit,
)

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]

env = protocol.env  # the fixtures: the worker context over the test's prefix, in the test's loop
tool_prefix = protocol.tool_prefix


def unanswered(conversation: list[dict[str, Any]]) -> list[tuple[int, set[str]]]:
    """``(index, ids)`` of each assistant turn whose tool calls the next message does not answer."""
    out = []
    for i, message in enumerate(conversation):
        content = message["content"]
        if message["role"] != "assistant" or not isinstance(content, list):
            continue
        calls = {b["id"] for b in content if b.get("type") == "tool_use"}
        after = conversation[i + 1]["content"] if i + 1 < len(conversation) else []
        answered = (
            {b.get("tool_use_id") for b in after if isinstance(b, dict)} if isinstance(after, list) else set()
        )
        if calls - answered:
            out.append((i, calls - answered))
    return out


async def queue_second(e: Env, task: str) -> tuple[str, list[Any]]:
    """A second run whose lead asks ``s`` to do ``task``: its run id and its
    member doorbell (which names the message), taken off the queue."""
    run_id = await submit(e, "fx", member_plan(task, via="s"))
    name, args = e.queue.pop(0)
    assert await e.run(name, args[0]) == "suspended"
    [(task_name, doorbell)] = e.queue
    e.queue.clear()
    assert task_name == DELIVER_TASK and doorbell[0] == "fx::s" and len(doorbell) == 2
    return run_id, doorbell


async def test_an_item_claimed_before_a_requeued_one_does_not_become_its_turns(env, raw, prefix):
    e = env
    first = await start_member(e, "charge sa-hang", via="s")
    await e.stall(DELIVER_TASK, "fx::s", raw, "start:charge:sa-hang")
    await e.crash_member()  # requeued: pending again, its claim expired
    second, doorbell = await queue_second(e, "lookup_docs sb")
    # the second item's doorbell names its message: it is claimed before the requeued one
    assert await e.run(DELIVER_TASK, *doorbell) == "done"
    assert unanswered(session_of(e, raw)) == []  # the interrupted call was answered first
    # the requeued item's last turns are no longer the conversation's: it starts over
    # (its calls still decided by its journal), and never answers with the second's turns
    assert await e.run(DELIVER_TASK, "fx::s") == "done"
    await e.drain()
    assert (await result_of(e, first)).result == "final: charged[sa-hang]"
    assert (await result_of(e, second)).result == "final: found[sb]"
    assert count(raw, prefix, "prep", "sa-hang") == 1 and count(raw, prefix, "charge", "sa-hang") == 2
    assert raw.get(f"{prefix}:test:provider:count:sa-hang") == "1"  # one effect: the same key again
    conversation = session_of(e, raw)
    assert unanswered(conversation) == []
    assert sum(isinstance(m["content"], str) for m in conversation) == 3  # a, b, a again


async def test_a_cancelled_parked_item_leaves_a_conversation_the_next_item_can_send(env, raw, prefix):
    e = env
    first = await park_session_email(e, raw, "sc-hang")
    await e.client.cancel(first)  # the parked call is never decided: its turn ends the conversation
    await e.drain()
    second = await start_member(e, "lookup_docs sd", via="s")
    assert await e.run(DELIVER_TASK, "fx::s") == "done"
    await e.drain()
    assert (await result_of(e, second)).result == "final: found[sd]"
    conversation = session_of(e, raw)
    assert unanswered(conversation) == []
    [closing] = [m for m in conversation if "content" in m and INTERRUPTED_RESULT in str(m["content"])]
    assert [b["tool_use_id"] for b in closing["content"]] == ["toolu_target"]
    assert all(b["is_error"] for b in closing["content"])
    assert count(raw, prefix, "send_email", "sc-hang") == 1


@pytest.mark.parametrize("journal", [True, False])
async def test_an_attempt_that_lost_its_claim_writes_nothing_more_to_the_conversation(
    env, raw, monkeypatch, journal
):
    e = env
    settings = e.ctx.settings.model_copy(update={"tool_journal": journal})
    monkeypatch.setattr(e.ctx, "settings", settings)  # journal off: the re-claimed item starts over
    release = asyncio.Event()

    async def hang(label: str, count: int) -> None:  # the first run of a "-hang" call waits for the test
        if "hang" in label.split("-") and count == 1:
            await release.wait()

    monkeypatch.setattr(effect_teams, "_hang", hang)
    run_id = await start_member(e, "lookup_docs sf-hang", via="s")
    await e.stall(DELIVER_TASK, "fx::s", raw, "start:lookup_docs:sf-hang")
    stalled = e.stalled.pop()
    await e.crash_member()
    assert await e.run(DELIVER_TASK, "fx::s") == "done"  # the next claim took the item over
    await e.drain()
    before = raw.lrange(session_key(e), 0, -1)
    release.set()  # the old attempt's call returns: it would record its result and go on
    assert await stalled == "lost"
    await e.ctx.writer.flush()
    assert raw.lrange(session_key(e), 0, -1) == before
    assert unanswered(session_of(e, raw)) == []
    assert (await result_of(e, run_id)).result == "final: found[sf-hang]"


async def test_a_claim_older_than_the_one_holding_the_conversation_cannot_take_it(env):
    e = env
    await start_member(e, "lookup_docs sg", via="s")
    claimed = await e.ctx.mailbox.claim_next("fx::s", lease_s=30, worker_id="w", max_in_flight=1)
    assert claimed is not None and claimed.lease_until is not None
    store, _ = await take_session(e.ctx, claimed, "run_x", read_all=False)
    older = claimed.model_copy(update={"lease_until": claimed.lease_until - 1, "claim_token": "old"})
    with pytest.raises(RunLeaseLostError):  # a stalled older claim taking it late is refused
        await take_session(e.ctx, older, "run_x", read_all=False)
    await store.append({"role": "user", "content": "still the holder's"})
    stale, _ = await take_session(e.ctx, claimed, "run_x", read_all=False)
    newer = claimed.model_copy(update={"lease_until": claimed.lease_until + 1, "claim_token": "new"})
    await take_session(e.ctx, newer, "run_x", read_all=False)
    with pytest.raises(RunLeaseLostError):  # once a later claim took it, the earlier one writes nothing
        await stale.append({"role": "user", "content": "too late"})
    assert await stale.load() == [{"role": "user", "content": "still the holder's"}]
