"""RunStore.begin_segment reads against the real Redis: the run record and the
lead's history in the start's round trip, and its pipeline when the server
does not know the script yet (NOSCRIPT).

Every test works under its own ``test-<uuid>`` key prefix and deletes every key
under it afterwards; the database is never flushed and no script cache is
flushed (others share the server).
"""

from __future__ import annotations

import json
import uuid

import pytest

from lattice_client.errors import RunLeaseLostError
from lattice_client.models import RunStatus
from lattice_client.runstore import RunStore
from lattice_mailbox.connections import async_redis

STATE_STORES = ("redis", "cluster")
"""Every test runs on the tests' Redis and on the session's Redis Cluster (tests/integration/conftest.py)."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def history_key(store: RunStore, run_id: str) -> str:
    return f"{store.keys(run_id).record}:history"


async def test_begin_segment_reads_the_record_and_history_with_the_start(store, raw):
    await store.create("r1", "team", "the prompt", metadata={"k": "v"})
    key = history_key(store, "r1")
    start = await store.begin_segment(
        "r1", expect=RunStatus.QUEUED, lease_s=30, read_record=True, history_key=key
    )
    assert start is not None and start.attempts == 1 and not start.recover
    assert start.record is not None
    assert (start.record.run_id, start.record.team, start.record.prompt) == ("r1", "team", "the prompt")
    assert start.record.status == RunStatus.RUNNING and start.record.metadata == {"k": "v"}
    assert start.history == []  # no history yet
    assert raw.zscore(store.leases_key, "r1") == start.lease_until
    # a suspension later, the next segment gets the stored messages in order
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    raw.rpush(key, *[json.dumps(m) for m in messages])
    raw.hset(store.keys("r1").record, "status", "resuming")
    again = await store.begin_segment(
        "r1", expect=RunStatus.RESUMING, lease_s=30, read_record=True, history_key=key
    )
    assert again is not None and again.attempts == 2
    assert [json.loads(x) for x in again.history] == messages
    # without the options nothing more is read
    raw.hset(store.keys("r1").record, "status", "resuming")
    plain = await store.begin_segment("r1", expect=RunStatus.RESUMING, lease_s=30)
    assert plain is not None and plain.record is None and plain.history is None


async def test_begin_segment_refusals_and_bad_history_keys(store):
    assert await store.begin_segment("nope", expect=RunStatus.QUEUED, lease_s=30, read_record=True) is None
    await store.create("r1", "team", "p")
    assert await store.begin_segment("r1", expect=RunStatus.RESUMING, lease_s=30, read_record=True) is None
    with pytest.raises(ValueError, match="not a key of run"):
        await store.begin_segment(
            "r1", expect=RunStatus.QUEUED, lease_s=30, history_key=history_key(store, "r2")
        )
    start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30, read_record=True)
    assert start is not None and start.record is not None
    assert await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30) is None  # exactly once


async def test_a_refused_start_says_the_status_it_found(store, raw, state_url):
    """The refusal carries the status seen in the same atomic step (a later read may see
    another: a log line built from one said "run ... is queued, not queued")."""

    async def refusal(run_id: str, expect: RunStatus) -> tuple[bool, str | None]:
        commands, source = store.begin_segment_call(run_id, expect=expect, lease_s=30)
        client = async_redis(state_url)
        try:
            async with client.pipeline(transaction=False) as pipe:
                pipe.zadd(*commands[0][1:3], gt=True)
                pipe.eval(source, *commands[1][2:])
                replies = await pipe.execute()
        finally:
            await client.aclose()
        started = store.begin_segment_reply(commands, replies) is not None
        return started, store.begin_segment_refusal(replies)

    assert await refusal("nope", RunStatus.QUEUED) == (False, None)  # missing
    await store.create("r1", "team", "p")
    assert await refusal("r1", RunStatus.RESUMING) == (False, "queued")
    assert await refusal("r1", RunStatus.QUEUED) == (True, None)
    assert await refusal("r1", RunStatus.QUEUED) == (False, "running")


async def test_begin_segment_loads_an_unknown_script_and_starts_once(store, raw):
    await store.create("r1", "team", "p")
    conn = store._conn()
    original = conn.scripts["begin_segment"]
    # the same script under a sha this server has never seen: the first send is refused (NOSCRIPT)
    fresh = conn.client.register_script(f"{original.script}\n-- {uuid.uuid4().hex}\n")
    conn.scripts["begin_segment"] = fresh
    try:
        start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30, read_record=True)
    finally:
        conn.scripts["begin_segment"] = original
    assert start is not None and start.attempts == 1
    assert start.record is not None and start.record.status == RunStatus.RUNNING
    assert raw.zscore(store.leases_key, "r1") == start.lease_until
    assert raw.hget(store.keys("r1").record, "lead_attempts") == "1"


async def test_script_calls_for_a_callers_pipeline_behave_like_the_methods(store, raw):
    await store.create("r1", "team", "p")
    start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30)
    assert start is not None
    entry = {"work_item_id": "wi-1", "mailbox_id": "team::m", "tool_use_id": "t1"}
    journal, journal_src = store.journal_call_call("r1", start.token, "t1", entry)
    history, history_src = store.write_history_call(
        "r1", start.token, history_key(store, "r1"), [b'{"role":"user","content":"x"}'], ttl_ms=60_000
    )
    assert journal[0] == history[0] == "evalsha" and "journal" in journal_src and "history" in history_src
    client = await store.redis()
    for source in (journal_src, history_src):  # the caller loads them (on NOSCRIPT, or up front)
        await client.script_load(source)
    async with client.pipeline(transaction=False) as pipe:
        for command in (journal, history, journal):
            getattr(pipe, command[0])(*command[1:])
        first, length, again = await pipe.execute()
    assert store.journal_reply(first) is None and length == 1
    assert store.journal_reply(again) == entry  # journaled once: the second call gets the entry back
    assert await store.journal("r1") == {"t1": entry}
    # a stale token: the reply maps to the methods' RunLeaseLostError
    stale, _ = store.write_history_call("r1", "not-the-token", history_key(store, "r1"), [b"{}"])
    async with client.pipeline(transaction=False) as pipe:
        getattr(pipe, stale[0])(*stale[1:])
        (reply,) = await pipe.execute(raise_on_error=False)
    assert isinstance(store.script_error(reply, "r1", "write_history"), RunLeaseLostError)
    assert raw.llen(history_key(store, "r1")) == 1
    with pytest.raises(RunLeaseLostError):
        await store.write_history("r1", "not-the-token", history_key(store, "r1"), [b"{}"])


def _item(n: int) -> dict:
    return {"work_item_id": f"wi-{n}", "message_id": f"m-{n}", "mailbox_id": "team::m", "member": "m"}


async def test_items_read_with_the_start_and_suspension_left_in_the_index(store, raw):
    await store.create("r1", "team", "p")
    start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30, read_items=True)
    assert start is not None and start.items == []
    # registration and completion through the caller's-pipeline forms
    call, source = store.add_items_call("r1", [_item(1), _item(2)], max_active=1, token=start.token)
    client = await store.redis()
    await client.script_load(source)
    async with client.pipeline(transaction=False) as pipe:
        getattr(pipe, call[0])(*call[1:])
        (reply,) = await pipe.execute()
    assert [it["work_item_id"] for it in store.add_items_reply(reply)] == ["wi-1"]  # max_active 1
    with pytest.raises(ValueError, match="appears twice"):
        store.add_items_call("r1", [_item(1), _item(1)], max_active=1)
    assert await store.suspend("r1", token=start.token, unindex_lease=False) is True
    assert raw.zscore(store.leases_key, "r1") is not None  # the caller removes it
    call, source = store.complete_item_call("r1", "wi-1", {"status": "done", "content": "a"})
    await client.script_load(source)
    async with client.pipeline(transaction=False) as pipe:
        getattr(pipe, call[0])(*call[1:])
        (reply,) = await pipe.execute()
    first = store.complete_reply(reply)
    assert first.recorded and not first.resume and [d["work_item_id"] for d in first.dispatch] == ["wi-2"]
    last = await store.complete_item("r1", "wi-2", {"status": "done", "content": "b"})
    assert last.resume and last.run_status == "resuming"
    again = await store.begin_segment("r1", expect=RunStatus.RESUMING, lease_s=30, read_items=True)
    assert again is not None and again.items == await store.items("r1")
    assert [(it["work_item_id"], it["state"], it["outcome"]["content"]) for it in again.items] == [
        ("wi-1", "done", "a"),
        ("wi-2", "done", "b"),
    ]


async def test_finish_leaves_the_lease_index_unless_another_segment_holds_the_run(store, raw):
    from lattice_client.models import RunResult

    assert await store.status("nope") is None
    await store.create("r1", "team", "p")
    assert await store.status("r1") == RunStatus.QUEUED
    start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30)
    assert start is not None and await store.status("r1") == RunStatus.RUNNING
    # a stale segment's finish is refused and the holder's index entry stays
    with pytest.raises(RunLeaseLostError):
        await store.finish("r1", RunResult(run_id="r1", status="completed", result="x"), token="stale")
    assert raw.zscore(store.leases_key, "r1") == start.lease_until
    assert await store.status("r1") == RunStatus.RUNNING
    ok = await store.finish("r1", RunResult(run_id="r1", status="completed", result="x"), token=start.token)
    assert ok and raw.zscore(store.leases_key, "r1") is None
    assert await store.status("r1") == RunStatus.COMPLETED
    # finished before: nothing written, and no entry left behind
    raw.zadd(store.leases_key, {"r1": 1})
    assert not await store.finish("r1", RunResult(run_id="r1", status="failed", error="e"), token=start.token)
    assert raw.zscore(store.leases_key, "r1") is None
    assert (await store.get("r1")).result.result == "x"


async def test_append_events_appends_in_order_in_one_call(store):
    from lattice_client.errors import RunNotFoundError

    await store.create("r1", "team", "p")
    first = await store.append_event("r1", {"type": "a"})
    ids = await store.append_events("r1", [{"type": "b", "n": 1}, {"type": "c", "text": "é"}])
    order = [tuple(int(x) for x in i.split("-")) for i in (first, *ids)]
    assert len(ids) == 2 and order == sorted(order) and len(set(order)) == 3
    assert [(e["type"], e.get("n"), e.get("text")) for _, e in await store.events("r1")] == [
        ("a", None, None),
        ("b", 1, None),
        ("c", None, "é"),
    ]
    assert await store.append_events("r1", []) == []
    with pytest.raises(ValueError, match="string 'type'"):
        await store.append_events("r1", [{"type": "ok"}, {"no": "type"}])
    with pytest.raises(RunNotFoundError):
        await store.append_events("nope", [{"type": "x"}])
    assert len(await store.events("r1")) == 3  # nothing of the refused calls


async def test_usage_read_with_the_start_and_finish_in_a_callers_pipeline(store, raw):
    from lattice_client.models import RunResult

    await store.create("r1", "team", "p")
    usage_key = f"{store.keys('r1').record}:usage"
    raw.hset(usage_key, mapping={"input_tokens": 3, "odd": "x"})
    start = await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30, usage_key=usage_key)
    assert start is not None and start.usage == {"input_tokens": 3}  # integer fields only
    with pytest.raises(ValueError, match="not a key of run"):
        await store.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30, usage_key="elsewhere:usage")
    call, source = store.finish_call(
        "r1", RunResult(run_id="r1", status="completed", result="x"), start.token
    )
    with pytest.raises(ValueError, match="does not match"):
        store.finish_call("r1", RunResult(run_id="r2", status="completed"), start.token)
    client = await store.redis()
    await client.script_load(source)
    raw.hset(store.keys("r1").record, "lease_token", "holder")  # another segment holds the run
    async with client.pipeline(transaction=False) as pipe:
        getattr(pipe, call[0])(*call[1:])
        pipe.zrem(store.leases_key, "r1")
        refused, _ = await pipe.execute(raise_on_error=False)
    assert isinstance(store.script_error(refused, "r1", "finish"), RunLeaseLostError)
    assert raw.zscore(store.leases_key, "r1") is None
    await store.reindex_lease("r1")  # the holder's entry goes back
    assert raw.zscore(store.leases_key, "r1") == start.lease_until
    assert (await store.get("r1")).result is None


async def test_create_indexes_in_its_round_trip_and_a_refused_one_changes_no_index(store, raw):
    record = await store.create("r1", "team", "p")
    assert raw.zscore(store.runs_index_key, "r1") == record.created_at
    assert raw.zscore(store.team_index_key("team"), "r1") == record.created_at
    raw.zrem(store.runs_index_key, "r1")  # an index entry gone (pruned, say)
    with pytest.raises(ValueError, match="already exists"):
        await store.create("r1", "other", "q")
    assert raw.zscore(store.runs_index_key, "r1") is None  # not added back by the refused call
    assert raw.zscore(store.team_index_key("other"), "r1") is None
    assert raw.zscore(store.team_index_key("team"), "r1") == record.created_at
    assert (await store.get("r1")).prompt == "p"
