"""The worker's run-event writer (``WorkerContext.emit`` / ``flush_events``) against the real Redis.

Events are queued and written in batches: at the latest
``EVENT_LINGER_SECONDS`` after the first one, or at once by ``flush_events``.
Every test has its own ``test-<uuid>`` key prefix; its keys are deleted afterwards.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid

import pytest
import redis

from lattice_worker.runtime.run.context import WorkerContext

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def _types(ctx: WorkerContext, run_id: str) -> list[str]:
    return [e["type"] for _, e in await ctx.runs.events(run_id, count=1000)]


async def test_flush_writes_every_queued_event_in_order(ctx):
    await ctx.runs.create("r1", "team", "prompt")
    await ctx.runs.create("r2", "team", "prompt")
    for i in range(5):
        await ctx.events.emit("r1", {"type": f"e{i}"})
        await ctx.events.emit("r2", {"type": f"f{i}"})
    await ctx.writer.flush()
    assert await _types(ctx, "r1") == ["e0", "e1", "e2", "e3", "e4"]
    assert await _types(ctx, "r2") == ["f0", "f1", "f2", "f3", "f4"]
    await ctx.writer.flush()  # nothing queued: returns, writes nothing more
    assert await _types(ctx, "r1") == ["e0", "e1", "e2", "e3", "e4"]


async def test_queued_events_are_written_without_a_flush(ctx):
    await ctx.runs.create("r1", "team", "prompt")
    await ctx.events.emit("r1", {"type": "lonely"})
    for _ in range(100):  # the writer's linger is far shorter than this loop's 5 s
        if await _types(ctx, "r1") == ["lonely"]:
            break
        await asyncio.sleep(0.05)
    assert await _types(ctx, "r1") == ["lonely"]
    # a later event starts a new batch
    await ctx.events.emit("r1", {"type": "second"})
    await ctx.writer.flush()
    assert await _types(ctx, "r1") == ["lonely", "second"]


async def test_concurrent_flushes_and_emits_lose_nothing(ctx):
    await ctx.runs.create("r1", "team", "prompt")

    async def producer(name: str) -> None:
        for i in range(20):
            await ctx.events.emit("r1", {"type": f"{name}{i}"})
            if i % 7 == 0:
                await ctx.writer.flush()
            await asyncio.sleep(0)

    await asyncio.gather(producer("a"), producer("b"), producer("c"))
    await ctx.writer.flush()
    types = await _types(ctx, "r1")
    assert sorted(types) == sorted(f"{n}{i}" for n in "abc" for i in range(20))
    for name in "abc":  # each producer's events keep their order
        assert [t for t in types if t[0] == name] == [f"{name}{i}" for i in range(20)]


async def test_add_usage_flushes_the_queued_events_and_sums_segments(ctx, raw):
    await ctx.runs.create("r1", "team", "prompt")
    await ctx.events.emit("r1", {"type": "assistant"})
    assert await ctx.usage.add("r1", {"input_tokens": 0, "output_tokens": 0}) == {}
    assert not raw.exists(ctx.keys.usage("r1"))  # an all-zero segment writes nothing
    assert await ctx.usage.add("r1", {"input_tokens": 3, "output_tokens": 2, "flag": True}) == {}
    assert await _types(ctx, "r1") == ["assistant"]  # written with the usage
    await ctx.events.emit("r1", {"type": "result"})
    total = await ctx.usage.add("r1", {"input_tokens": 4, "output_tokens": 0, "cache": 0}, total=True)
    assert total == {"input_tokens": 7, "output_tokens": 2, "cache": 0}
    assert await _types(ctx, "r1") == ["assistant", "result"]
    assert 0 < raw.ttl(ctx.keys.usage("r1"))


async def test_add_usage_raises_a_failed_write_and_the_events_still_land(ctx, raw):
    await ctx.runs.create("r1", "team", "prompt")
    raw.set(ctx.keys.usage("r1"), "not a hash")
    await ctx.events.emit("r1", {"type": "assistant"})
    with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
        await ctx.usage.add("r1", {"input_tokens": 1}, total=True)
    assert await _types(ctx, "r1") == ["assistant"]
    await ctx.events.emit("r1", {"type": "after"})  # the writer goes on
    await ctx.writer.flush()
    assert await _types(ctx, "r1") == ["assistant", "after"]


async def test_queued_writes_go_with_the_next_flush_and_sync_raises_their_failure_once(ctx, raw):
    key = f"{ctx.prefix}:test:list"
    ctx.writer.queue_write([("rpush", key, "a")], fence="seg-1")
    ctx.writer.queue_write([("rpush", key, "b")], fence="seg-1")
    await ctx.writer.sync("seg-1")
    assert raw.lrange(key, 0, -1) == ["a", "b"]
    # a failing queued write: logged, kept for sync() of its fence, mapped by on_error
    raw.set(f"{ctx.prefix}:test:str", "x")
    ctx.writer.queue_write(
        [("rpush", f"{ctx.prefix}:test:str", "c")],
        fence="seg-2",
        on_error=lambda exc: RuntimeError(f"mapped: {exc}"),
    )
    ctx.writer.queue_write([("rpush", key, "d")], fence="seg-2")  # the rest of the batch is written
    await ctx.writer.sync("seg-1")  # another fence: nothing to raise
    with pytest.raises(RuntimeError, match="mapped: .*WRONGTYPE"):
        await ctx.writer.sync("seg-2")
    await ctx.writer.sync("seg-2")  # raised once
    assert raw.lrange(key, 0, -1) == ["a", "b", "d"]


async def test_write_returns_replies_after_the_queued_ones_and_raises_errors(ctx, raw):
    key = f"{ctx.prefix}:test:list"
    ctx.writer.queue_write([("rpush", key, "queued")])
    replies = await ctx.writer.write([("rpush", key, "now"), ("lrange", key, 0, -1)])
    assert replies == [2, [b"queued", b"now"]]
    raw.set(f"{ctx.prefix}:test:str", "x")
    with pytest.raises(ValueError, match="WRONGTYPE"):
        await ctx.writer.write(
            [("rpush", f"{ctx.prefix}:test:str", "c")], on_error=lambda exc: ValueError(str(exc))
        )


async def test_writes_of_a_script_the_server_lacks_are_loaded_and_sent_again(ctx, raw):
    key = f"{ctx.prefix}:test:list"
    # a script this server has never seen (unique text): the first EVALSHA is refused with NOSCRIPT
    source = f"-- {uuid.uuid4().hex}\nreturn redis.call('RPUSH', KEYS[1], ARGV[1])"
    sha = hashlib.sha1(source.encode()).hexdigest()
    ctx.writer.queue_write([("evalsha", sha, 1, key, "queued")], scripts=(source,), fence="seg")
    assert await ctx.writer.write([("evalsha", sha, 1, key, "now")], scripts=(source,)) == [2]
    await ctx.writer.sync("seg")
    assert raw.lrange(key, 0, -1) == ["queued", "now"]


async def test_add_usage_with_known_totals_queues_the_increments_and_reads_nothing(ctx, raw):
    await ctx.runs.create("r1", "team", "prompt")
    raw.hset(ctx.keys.usage("r1"), mapping={"input_tokens": 10, "output_tokens": 1})
    known = {"input_tokens": 10, "output_tokens": 1}  # as read when the segment started
    assert await ctx.usage.add("r1", {"input_tokens": 5, "output_tokens": 0}, known=known, fence="seg") == {}
    assert raw.hget(ctx.keys.usage("r1"), "input_tokens") == "10"  # queued
    total = await ctx.usage.add("r1", {"input_tokens": 1, "cache": 0}, total=True, known=known, fence="seg")
    assert total == {"input_tokens": 16, "output_tokens": 1, "cache": 0}
    assert known == {"input_tokens": 16, "output_tokens": 1}
    await ctx.writer.sync("seg")
    assert raw.hgetall(ctx.keys.usage("r1")) == {"input_tokens": "16", "output_tokens": "1"}


async def test_event_models_are_stored_as_their_json_and_stream_deltas_are_not(ctx):
    from lattice_worker.agent.events import AssistantMessage, StreamEvent
    from lattice_worker.team.events import AgentMessageEvent, TeamMessageEvent

    await ctx.runs.create("r1", "team", "prompt")
    events = [
        AssistantMessage(session_id="s", turn=1, message={"role": "assistant", "content": "é ✓", "x": 0.1}),
        TeamMessageEvent(subtype="sent", team="t", message={"id": "m1", "content": "hi"}),
        AgentMessageEvent(team="t", member="m", mailbox="t::m", message={"type": "user", "n": [1, 2]}),
        {"type": "run_status", "status": "suspended", "run_id": "r1"},
    ]
    for event in events:
        await ctx.events.emit("r1", event)
    await ctx.events.emit("r1", StreamEvent(session_id="s", event={"type": "content_block_delta"}))
    await ctx.events.emit(
        "r1", AgentMessageEvent(team="t", member="m", mailbox="t::m", message={"type": "stream_event"})
    )
    await ctx.writer.flush()
    stored = [e for _, e in await ctx.runs.events("r1", count=100)]
    expected = [e if isinstance(e, dict) else e.model_dump(mode="json") for e in events]
    assert stored == expected


async def test_concurrent_writes_go_in_queue_order_and_each_gets_its_own_replies(ctx, raw):
    """Writes from several tasks at once: one batch in flight at a time, in the
    order they were queued; every caller gets the replies of its own commands."""
    key = f"{ctx.prefix}:test:list"
    ctx.writer.queue_write([("rpush", key, "queued")])

    async def push(i: int) -> list:
        return await ctx.writer.write([("rpush", key, str(i)), ("llen", key)])

    replies = await asyncio.gather(*(push(i) for i in range(20)))
    assert [r[0] for r in replies] == [i + 2 for i in range(20)]  # RPUSH answers the new length
    assert all(r[1] >= r[0] for r in replies)
    assert raw.lrange(key, 0, -1) == ["queued"] + [str(i) for i in range(20)]
    await ctx.events.emit("r0", {"type": "x"})  # unknown run: the events are reported lost, nothing hangs
    await ctx.writer.flush()


async def test_the_writer_reconnects_after_the_server_closed_its_connection(ctx, raw):
    key = f"{ctx.prefix}:test:list"
    [writer_id] = await ctx.writer.write([("client_id",)])
    raw.client_kill_filter(_id=writer_id)
    # the closed connection is found before the write goes on it (lattice_mailbox.connections)
    [length] = await ctx.writer.write([("rpush", key, "first")])
    [length] = await ctx.writer.write([("rpush", key, "after")])
    assert raw.lrange(key, 0, -1) == ["first", "after"] and length == 2
    [new_id] = await ctx.writer.write([("client_id",)])
    assert new_id != writer_id


async def test_a_caller_cancelled_mid_write_fails_none_of_the_other_writes_of_its_batch(ctx, raw):
    """Writes of several tasks share one batch; the task that writes the batch is
    cancelled while it is in flight: every other task's write lands and gets its replies."""
    await ctx.runs.create("r1", "team", "prompt")
    key = f"{ctx.prefix}:test:list"

    def busy(ms: int, tag: str) -> tuple:  # a script that holds the server for ms milliseconds
        lua = (
            "redis.call('RPUSH', KEYS[1], ARGV[2]) local t = redis.call('TIME') local s = t[1] * 1e6 + t[2] "
            "while true do local n = redis.call('TIME') if n[1] * 1e6 + n[2] - s > ARGV[1] * 1000 then break end "
            "end return 1"
        )
        return ("eval", lua, 1, key, ms, tag)

    await ctx.events.emit("r1", {"type": "warm"})  # (later emits only queue: no read of the run)
    await ctx.writer.flush()
    # a first task's batch is in flight; the doomed task's flush waits for it, then
    # writes the next batch (the oldest waiting flush does), which holds the other
    # tasks' writes and events too
    first = asyncio.create_task(ctx.writer.write([busy(100, "first")]))
    await asyncio.sleep(0.02)
    doomed = asyncio.create_task(ctx.writer.write([busy(1500, "doomed")]))
    await asyncio.sleep(0.02)
    for _ in range(3):
        await ctx.events.emit("r1", {"type": "from-another-task"})
    others = [
        asyncio.create_task(ctx.writer.write([("rpush", key, f"o{i}"), ("llen", key)])) for i in range(3)
    ]
    marker = ctx.writer.queue_write([("rpush", key, "marker")])  # (before the others: they start later)
    while ctx.writer.still_queued(marker):  # noqa: ASYNC110 - until the second batch is taken...
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.2)  # ...and in flight
    doomed.cancel()
    await asyncio.gather(doomed, return_exceptions=True)
    assert doomed.cancelled()
    replies = await asyncio.gather(first, *others)  # none failed, each got its own replies
    assert replies == [[1], [4, 4], [5, 5], [6, 6]]
    await ctx.writer.sync()
    assert raw.lrange(key, 0, -1) == ["first", "doomed", "marker", "o0", "o1", "o2"]
    assert await _types(ctx, "r1") == ["warm"] + ["from-another-task"] * 3


async def test_a_member_items_queued_history_appends_go_as_one_write_in_order(ctx, raw):
    from types import SimpleNamespace

    from lattice_worker.runtime.run.journal import ItemHistoryStore, ItemJournal

    await ctx.runs.create("r1", "team", "prompt")
    message = SimpleNamespace(id="m1", to="team::echo", work_item_id="w1", attempts=1, claim_token="tok")
    journal = ItemJournal(ctx, "r1", "team", "echo", message)
    store = ItemHistoryStore(journal, history=[])
    key = ctx.runs.item_history_key("r1", "w1")
    await store.append({"role": "user", "content": "a"})
    await ctx.events.emit("r1", {"type": "between"})  # run events do not split the write
    await store.append({"role": "assistant", "content": "b"})
    (op,) = [q for q in ctx.writer._queue if not isinstance(q, tuple)]
    assert op.commands[0][0] == "evalsha" and op.commands[0][-2:] == (
        b'{"role":"user","content":"a"}',
        b'{"role":"assistant","content":"b"}',
    )
    # a journal field write queued after it: the next append is a write of its own, after the field
    await journal._set({"call:1": {"state": "started"}}, durable=False)
    await store.append({"role": "user", "content": "c"})
    assert len([q for q in ctx.writer._queue if not isinstance(q, tuple)]) == 3
    await ctx.writer.flush()
    assert [json.loads(m)["content"] for m in raw.lrange(key, 0, -1)] == ["a", "b", "c"]
    # a replace and the appends after it: one write that replaces with all of them
    await store.replace([{"role": "user", "content": "x"}])
    await store.append({"role": "assistant", "content": "y"})
    assert len([q for q in ctx.writer._queue if not isinstance(q, tuple)]) == 1
    await ctx.writer.flush()
    assert [json.loads(m)["content"] for m in raw.lrange(key, 0, -1)] == ["x", "y"]
    assert await _types(ctx, "r1") == ["between"]
