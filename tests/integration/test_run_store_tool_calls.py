"""The run store's tool journals and waits (runstore/tool_calls.py and its Lua
scripts) against the real Redis: claim fencing of a work item's writes, the
lead's journal under its lease, and every refusal of a decision on a wait
(nothing changes). docs/tool-effects.md."""

from __future__ import annotations

import json

import pytest

from lattice_client.errors import RunLeaseLostError
from lattice_client.runstore import WaitStateError
from tests.support.runstore import run_call

STATE_STORES = ("redis", "cluster")
"""Every test runs on the tests' Redis and on the session's Redis Cluster (tests/integration/conftest.py)."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def test_a_work_items_writes_belong_to_its_latest_claim(store, raw, prefix):
    await store.create("r1", "team", "prompt")
    first = store.write_item_call(
        "r1", "wi", 1, "tok1", [b'{"role":"user","content":"go"}'], {"t1": {"s": 1}}
    )
    assert await run_call(store, first) == 1
    # the same attempts with another token, and an older attempt, are refused
    with pytest.raises(RunLeaseLostError):
        await run_call(store, store.write_item_call("r1", "wi", 1, "other", [b"{}"]))
    # a re-claim begins: it reads what was written and takes the item over
    history, journal = await store.begin_item("r1", "wi", 2, "tok2")
    assert history == ['{"role":"user","content":"go"}'] and journal == {"t1": {"s": 1}}
    with pytest.raises(RunLeaseLostError):  # the first claim is fenced out now
        await run_call(store, store.write_item_call("r1", "wi", 1, "tok1", [b"{}"]))
    with pytest.raises(RunLeaseLostError):
        await store.begin_item("r1", "wi", 1, "tok1")
    with pytest.raises(RunLeaseLostError):
        await run_call(store, store.park_item_call("r1", "wi", 1, "tok1", "m1", {"kind": "parked"}))
    assert raw.lrange(store.item_history_key("r1", "wi"), 0, -1) == ['{"role":"user","content":"go"}']
    # the current claim replaces the history (a replayed turn) and writes its records
    replaced = store.write_item_call("r1", "wi", 2, "tok2", [b'{"a":1}', b'{"b":2}'], {"t2": 2}, replace=True)
    assert await run_call(store, replaced) == 2
    assert raw.hget(store.item_journal_key("r1", "wi"), "t2") == "2"
    assert (
        raw.pttl(store.item_journal_key("r1", "wi")) > 0 and raw.pttl(store.item_history_key("r1", "wi")) > 0
    )
    with pytest.raises(ValueError, match="work item id"):
        store.item_journal_key("r1", "bad{tag}")


async def test_the_leads_journal_is_written_only_under_its_lease(store, raw):
    await store.create("r1", "team", "prompt")
    start = await store.begin_segment("r1", expect="queued", lease_s=30)
    assert (
        await run_call(store, store.journal_tool_call("r1", start.token, {"t1": {"status": "started"}})) == 1
    )
    assert await store.lead_tool_journal("r1") == {"t1": {"status": "started"}}
    with pytest.raises(RunLeaseLostError):
        await run_call(store, store.journal_tool_call("r1", "stale", {"t1": {"status": "completed"}}))
    assert await store.lead_tool_journal("r1") == {"t1": {"status": "started"}}


async def test_decisions_on_waits_are_recorded_once_and_refusals_change_nothing(store, raw):
    await store.create("r1", "team", "prompt")
    start = await store.begin_segment("r1", expect="queued", lease_s=30)
    wait = {
        "id": "r1/t1",
        "kind": "parked",
        "message_id": None,
        "run_id": "r1",
        "team": "team",
        "resolution": None,
    }
    await run_call(store, store.park_lead_call("r1", start.token, "r1/t1", wait))
    record = await store.get("r1")
    assert record.status.value == "suspended"
    assert raw.hget(store.keys("r1").record, "parked") == "r1/t1"
    with pytest.raises(RunLeaseLostError):  # the segment ended with the park
        await run_call(store, store.journal_tool_call("r1", start.token, {"x": 1}))

    args = {"journal_key": store.tools_key("r1"), "field": "t1", "value": {"status": "completed"}}
    with pytest.raises(WaitStateError) as nowait:
        await store.resolve_wait("r1", "r1/nope", kind="parked", resolution={"a": 1}, **args)
    assert nowait.value.code == "nowait"
    with pytest.raises(WaitStateError) as wrong:
        await store.resolve_wait("r1", "r1/t1", kind="approval", resolution={"a": 1}, **args)
    assert wrong.value.code == "wrongkind"
    assert await store.lead_tool_journal("r1") == {}  # nothing changed
    assert (await store.get("r1")).status.value == "suspended"

    recorded, stored = await store.resolve_wait("r1", "r1/t1", kind="parked", resolution={"a": 1}, **args)
    assert recorded and stored["resolution"] == {"a": 1}
    assert await store.lead_tool_journal("r1") == {"t1": {"status": "completed"}}
    assert raw.hget(store.keys("r1").record, "status") == "resuming"
    assert raw.hget(store.keys("r1").record, "recover") == "1"
    with pytest.raises(WaitStateError):  # decided: the lead's wait is closed
        await store.resolve_wait("r1", "r1/t1", kind="parked", resolution={"a": 2}, **args)


async def test_a_members_wait_stays_decided_until_its_next_claim_begins(store, raw):
    await store.create("r1", "team", "prompt")
    await run_call(store, store.write_item_call("r1", "wi", 1, "tok1", []))
    wait = {"id": "m1", "kind": "parked", "message_id": "m1", "work_item_id": "wi", "resolution": None}
    await run_call(store, store.park_item_call("r1", "wi", 1, "tok1", "m1", wait))
    assert [w["id"] for w in await store.waits()] == []  # not in the listing index: only the runtime adds it
    client = await store.redis()
    await client.zadd(store.waiting_index_key, {"r1": 1})
    assert [w["id"] for w in await store.waits(kind="parked")] == ["m1"]
    assert await store.waits(kind="approval") == []
    journal = store.item_journal_key("r1", "wi")
    recorded, _ = await store.resolve_wait(
        "r1",
        "m1",
        kind="parked",
        journal_key=journal,
        field="t1",
        delete=True,
        resolution={"action": "retry"},
    )
    assert recorded
    again, stored = await store.resolve_wait(
        "r1",
        "m1",
        kind="parked",
        journal_key=journal,
        field="t1",
        delete=True,
        resolution={"action": "other"},
    )
    assert not again and stored["resolution"] == {"action": "retry"}  # the first decision stands
    assert await store.waits() == []  # decided: no longer listed
    assert json.loads(raw.hget(store.waits_key("r1"), "m1"))["resolution"] == {"action": "retry"}
    await store.begin_item("r1", "wi", 2, "tok2")  # the next claim closes it
    assert raw.hget(store.waits_key("r1"), "m1") is None
    assert raw.hget(journal, "~waiting") is None


async def test_a_going_run_keeps_its_listing_place_between_waits_and_a_finished_one_loses_it(store, raw):
    """A listing that reads a run with no wait open must not drop it from the
    index: the run's next wait may be written meanwhile, and would then never
    be listed (an approval card that never shows)."""
    await store.create("r1", "team", "prompt")
    client = await store.redis()
    await client.zadd(store.waiting_index_key, {"r1": 1})  # it waited once; that wait is closed
    assert await store.waits() == []
    assert raw.zscore(store.waiting_index_key, "r1") is not None  # still indexed
    await run_call(store, store.write_item_call("r1", "wi", 1, "tok1", []))
    wait = {"id": "m2", "kind": "approval", "message_id": "m2", "work_item_id": "wi", "resolution": None}
    await run_call(store, store.park_item_call("r1", "wi", 1, "tok1", "m2", wait))  # the next wait
    assert [w["id"] for w in await store.waits()] == ["m2"]
    await store.cancel("r1")
    assert await store.waits() == []
    assert raw.zscore(store.waiting_index_key, "r1") is None  # finished: dropped
