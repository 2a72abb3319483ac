"""A lead segment's history writes through the worker's writer, against the real Redis.

``FencedHistoryStore(..., writer=ctx.writer)``: appends and replacements are queued
and go with the segment's next write, ``ctx.writer.sync(token)``, a read, or after the
writer's linger; every write stays fenced by the segment's lease.
Every test has its own ``test-<uuid>`` key prefix; its keys are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis

from lattice_client.errors import RunLeaseLostError
from lattice_client.models import RunStatus
from lattice_worker.runtime.lead.lease import FencedHistoryStore, LeadLease
from lattice_worker.runtime.run.context import WorkerContext

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


USER = {"role": "user", "content": "the prompt"}
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x", "input": {}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}


async def segment(ctx: WorkerContext, run_id: str = "r1") -> tuple[LeadLease, FencedHistoryStore]:
    await ctx.runs.create(run_id, "team", "p")
    start = await ctx.runs.begin_segment(run_id, expect=RunStatus.QUEUED, lease_s=30)
    assert start is not None
    lease = LeadLease(ctx.runs, run_id, start, 30)
    store = FencedHistoryStore(lease, ctx.client, ctx.keys.history(run_id), ttl_seconds=60, writer=ctx.writer)
    return lease, store


def stored(raw: redis.Redis, ctx: WorkerContext, run_id: str = "r1") -> list[dict]:
    return [json.loads(x) for x in raw.lrange(ctx.keys.history(run_id), 0, -1)]


async def test_writes_wait_for_the_segments_next_write_or_sync(ctx, raw):
    lease, store = await segment(ctx)
    await store.append(USER)
    await store.append(CALL)
    assert stored(raw, ctx) == []  # queued: nothing was awaited since
    await ctx.writer.write([("get", "unrelated")])  # any write of the segment takes them along, first
    assert stored(raw, ctx) == [USER, CALL]
    await store.append(RESULT)
    assert stored(raw, ctx) == [USER, CALL]
    await ctx.writer.sync(lease.token)
    assert stored(raw, ctx) == [USER, CALL, RESULT]
    assert 0 < raw.pttl(ctx.keys.history("r1")) <= 60_000
    await store.replace([USER])
    await store.append(CALL)
    assert stored(raw, ctx) == [USER, CALL, RESULT]
    assert await store.load() == [USER, CALL]  # a read writes what was queued first
    assert stored(raw, ctx) == [USER, CALL]
    await store.append(RESULT)
    for _ in range(100):  # without any write or sync the writer's linger sends them (well within 5 s)
        if stored(raw, ctx) == [USER, CALL, RESULT]:
            break
        await asyncio.sleep(0.05)
    assert stored(raw, ctx) == [USER, CALL, RESULT]
    assert not lease.lost


async def test_a_lost_lease_refuses_every_write_and_says_so(ctx, raw):
    lease, store = await segment(ctx)
    await store.append(USER)
    raw.hset(ctx.runs.keys("r1").record, "lease_token", "someone-else")
    await store.append(RESULT)  # queued: the refusal comes with sync
    with pytest.raises(RunLeaseLostError):
        await ctx.writer.sync(lease.token)
    assert lease.lost
    await store.replace([USER])
    with pytest.raises(RunLeaseLostError):
        await store.load()  # reads write what was queued first: refused
    assert stored(raw, ctx) == []


async def test_preloaded_history_is_the_first_load_only(ctx, raw):
    await ctx.runs.create("r1", "team", "p")
    start = await ctx.runs.begin_segment(
        "r1", expect=RunStatus.QUEUED, lease_s=30, history_key=ctx.keys.history("r1")
    )
    assert start is not None and start.history == []
    lease = LeadLease(ctx.runs, "r1", start, 30)
    raw.rpush(ctx.keys.history("r1"), json.dumps(USER), "not json")
    store = FencedHistoryStore(
        lease, ctx.client, ctx.keys.history("r1"), history=[json.dumps(CALL), "{bad"], writer=ctx.writer
    )
    assert await store.load() == [CALL]  # the elements given (malformed ones skipped)
    assert await store.load() == [USER]  # then the list itself


async def test_history_writes_queued_in_a_row_are_stored_as_one_in_order(ctx, raw):
    """Writes still queued are merged into one fenced script call (around events and
    other queued commands); the list ends up exactly as with separate writes."""
    lease, store = await segment(ctx)
    await store.append(USER)
    await ctx.events.emit("r1", {"type": "system"})
    ctx.writer.queue_write([("set", f"{ctx.prefix}:marker", "1")])
    await store.append(CALL)
    await store.append(RESULT)
    await ctx.writer.sync(lease.token)
    assert stored(raw, ctx) == [USER, CALL, RESULT]
    assert raw.get(f"{ctx.prefix}:marker") == "1"
    await store.replace([USER])  # a replacement, then appends: the same list as written one by one
    await store.append(RESULT)
    await ctx.writer.write([("get", "unrelated")])
    assert stored(raw, ctx) == [USER, RESULT]
    await store.append(CALL)
    await ctx.writer.write([("get", "unrelated")])  # a write waited for in between: not merged across it
    await store.append(RESULT)
    await ctx.writer.sync(lease.token)
    assert stored(raw, ctx) == [USER, RESULT, CALL, RESULT]
    raw.hset(ctx.runs.keys("r1").record, "lease_token", "someone-else")
    await store.append(USER)
    await store.append(CALL)  # merged: refused together
    with pytest.raises(RunLeaseLostError):
        await ctx.writer.sync(lease.token)
    assert stored(raw, ctx) == [USER, RESULT, CALL, RESULT]
    assert lease.lost
