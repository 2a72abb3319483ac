"""Run events are fenced like the run's other writes (``append_events_fenced.lua``).

A lead segment's events go to the run's stream only while it holds the run's
lease; a member's only while no later claim of its work item wrote. The check
and the append are one script call. Real Redis, one key prefix per test.
"""

from __future__ import annotations

import asyncio

import pytest

from lattice_client.errors import RunLeaseLostError
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.reaper import sweep as reaper
from lattice_worker.runtime.run.events import current_fence
from tests.e2e.teams import plan
from tests.integration import test_distributed_protocol, test_reaper_orphans
from tests.integration.test_distributed_protocol import submit

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

env = test_distributed_protocol.env
"""A worker context on the e2e teams and its task collector (``test_distributed_protocol``)."""


prefix = test_reaper_orphans.prefix
"""The unique prefix, also as ``LATTICE_KEY_PREFIX`` (``test_reaper_orphans``)."""


async def _types(ctx, run_id: str) -> list[str]:
    return [e["type"] for _, e in await ctx.runs.events(run_id, count=1000)]


async def _member_at_work(ctx, broker, task: str) -> tuple[str, asyncio.Task, list[str]]:
    """A run whose member ``worker`` is working on ``task`` (lease 0.3 s):
    ``(run id, its deliver task, the run's event types so far)``."""
    ctx.settings = ctx.settings.with_overrides(lease_seconds=0.3)
    run_id = await submit(ctx, broker, "e2e", plan(("worker", "handoff", task)))
    name, args, _ = broker.queue.pop(0)
    await broker.run_one(name, args)
    broker.queue.clear()
    member = asyncio.create_task(member_step.deliver(ctx, "e2e::worker"))
    await asyncio.sleep(0.2)  # the member is working (sleeping in its tool)
    await ctx.writer.flush()
    return run_id, member, await _types(ctx, run_id)


async def test_a_lead_fence_holds_while_the_segment_holds_the_run(ctx):
    runs = ctx.runs
    await runs.create("r1", "team", "prompt")
    first = await runs.begin_segment("r1", expect="queued", lease_s=30)
    fence = runs.lead_events_fence("r1", first.token)
    assert len(await runs.append_events("r1", [{"type": "a"}, {"type": "b"}], fence=fence)) == 2

    # the lease expired and the reaper handed the run to another segment
    recovery = await runs.recover_lead("r1", max_attempts=3, now=first.lease_until + 1)
    assert recovery.action == "requeued"
    with pytest.raises(RunLeaseLostError):
        await runs.append_events("r1", [{"type": "stale"}], fence=fence)
    second = await runs.begin_segment("r1", expect="resuming", lease_s=30)
    with pytest.raises(RunLeaseLostError):
        await runs.append_events("r1", [{"type": "stale"}, {"type": "stale"}], fence=fence)
    await runs.append_events("r1", [{"type": "c"}], fence=runs.lead_events_fence("r1", second.token))
    assert await _types(ctx, "r1") == ["a", "b", "c"]

    # bad input: a fence of another run, an empty token; nothing stored
    await runs.create("r2", "team", "prompt")
    with pytest.raises(ValueError, match="not run 'r2'"):
        await runs.append_events("r2", [{"type": "x"}], fence=fence)
    with pytest.raises(ValueError, match="lease token"):
        runs.lead_events_fence("r1", "")
    assert await _types(ctx, "r2") == []


async def test_an_item_fence_is_taken_over_by_a_later_claim(ctx):
    runs = ctx.runs
    await runs.create("r1", "team", "prompt")
    first = runs.item_events_fence("r1", "w1", 1, "tok-1")
    await runs.append_events("r1", [{"type": "a"}], fence=first)
    await runs.append_events("r1", [{"type": "b"}], fence=first)
    second = runs.item_events_fence("r1", "w1", 2, "tok-2")
    await runs.append_events("r1", [{"type": "c"}], fence=second)  # a later claim takes the item over
    for stale in (first, runs.item_events_fence("r1", "w1", 2, "tok-other")):
        with pytest.raises(RunLeaseLostError):
            await runs.append_events("r1", [{"type": "stale"}], fence=stale)
    # another item of the run has its own fence
    await runs.append_events("r1", [{"type": "d"}], fence=runs.item_events_fence("r1", "w2", 1, "tok-3"))
    assert await _types(ctx, "r1") == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="claim token"):
        runs.item_events_fence("r1", "w1", 1, "")


async def test_the_emitter_writes_a_stale_segments_events_nowhere_and_keeps_the_order(ctx):
    runs = ctx.runs
    await runs.create("r1", "team", "prompt")
    await runs.create("r2", "team", "prompt")
    segment = await runs.begin_segment("r1", expect="queued", lease_s=30)
    fence = runs.lead_events_fence("r1", segment.token)
    reset = current_fence.set(fence)
    try:
        await ctx.events.emit("r1", {"type": "fenced"})
        await ctx.events.emit("r2", {"type": "other run"})  # not this fence's run: unfenced
        await ctx.events.emit("r1", {"type": "unfenced"}, fence=None)  # None: the context's fence
    finally:
        current_fence.reset(reset)
    await ctx.events.emit("r1", {"type": "no fence"})
    await ctx.writer.flush()
    assert await _types(ctx, "r1") == ["fenced", "unfenced", "no fence"]
    assert await _types(ctx, "r2") == ["other run"]

    await runs.recover_lead("r1", max_attempts=3, now=segment.lease_until + 1)
    reset = current_fence.set(fence)
    try:
        await ctx.events.emit("r1", {"type": "stale 1"})
        await ctx.events.emit("r1", {"type": "stale 2"})
    finally:
        current_fence.reset(reset)
    await ctx.events.emit("r1", {"type": "after"})  # same batch, no fence: written after the refused ones
    await ctx.writer.flush()
    assert await _types(ctx, "r1") == ["fenced", "unfenced", "no fence", "after"]


async def test_a_member_that_lost_its_claim_writes_no_event_after_its_successor_began(env, prefix):
    ctx, broker = env
    run_id, first, before = await _member_at_work(ctx, broker, "slow sleep=1")
    assert "team_message" in before  # its "claimed" event, under its claim
    # the store expires the claim (as if renewals had stalled); another worker re-claims and begins
    await ctx.mailbox.requeue_expired(now_ms=2**50)
    successor = await ctx.mailbox.claim_next("e2e::worker", lease_s=30, worker_id="successor")
    fence = ctx.runs.item_events_fence(
        run_id, successor.work_item_id, successor.attempts, successor.claim_token
    )
    await ctx.runs.append_events(run_id, [{"type": "successor began"}], fence=fence)
    assert await first == "lost"
    await ctx.writer.flush()
    after = await _types(ctx, run_id)
    # the first worker's tool result, assistant turn, "failed"/"cancelled" message events: none landed
    assert after == [*before, "successor began"], after


async def test_a_revoked_claim_is_refused_and_the_next_claim_takes_the_item_over(ctx):
    runs = ctx.runs
    await runs.create("r1", "team", "prompt")
    first = runs.item_events_fence("r1", "w1", 1, "tok-1")
    await runs.append_events("r1", [{"type": "a"}], fence=first)
    assert await runs.revoke_item_claim("r1", "w1", 1) is True  # its lease expired
    with pytest.raises(RunLeaseLostError):
        await runs.append_events("r1", [{"type": "stale"}], fence=first)
    second = runs.item_events_fence("r1", "w1", 2, "tok-2")
    await runs.append_events("r1", [{"type": "b"}], fence=second)
    assert await runs.revoke_item_claim("r1", "w1", 1) is False  # a later claim holds it: unchanged
    await runs.append_events("r1", [{"type": "c"}], fence=second)
    assert await _types(ctx, "r1") == ["a", "b", "c"]
    with pytest.raises(ValueError, match="attempts"):
        await runs.revoke_item_claim("r1", "w1", -1)


async def test_a_member_whose_claim_the_reaper_requeued_writes_no_more_events(env, prefix, monkeypatch):
    ctx, broker = env
    run_id, first, before = await _member_at_work(ctx, broker, "stalled sleep=1")
    # the reaper finds the claim expired (as if renewals had stalled) and requeues it; nobody claims yet
    requeue = ctx.mailbox.requeue_expired
    monkeypatch.setattr(ctx.mailbox, "requeue_expired", lambda **kw: requeue(now_ms=2**50, **kw))
    report = await reaper.sweep(ctx, force=True)
    [message] = await ctx.mailbox.inbox("e2e::worker")
    assert report.requeued == [message.id] and message.attempts == 1
    assert await first == "lost"
    await ctx.writer.flush()
    assert await _types(ctx, run_id) == before  # nothing more from the stalled worker
    # the next claim takes the item over and finishes the run (the real requeue back; not
    # monkeypatch.undo(), which would also drop LATTICE_KEY_PREFIX, the prefix the work tool records under)
    monkeypatch.setattr(ctx.mailbox, "requeue_expired", requeue)
    await broker.drain()
    record = await ctx.runs.get(run_id)
    assert record.result.result == "final: done:worked[stalled sleep=1]"
    assert (await ctx.mailbox.get(message.id)).attempts == 2
