"""RunStore against the real Redis on 127.0.0.1:6379.

Every test works under its own ``test-<uuid>`` key prefix and deletes every key
under it afterwards; the database is never flushed (others share the server).
"""

from __future__ import annotations

import asyncio
import json
import random
import threading

import pytest
from redis.asyncio import Redis

from lattice_client.errors import RunNotFoundError, RunStateError
from lattice_client.models import RunResult, RunStatus
from lattice_client.runstore import CompleteResult, RunStore
from lattice_mailbox.connections import async_redis

STATE_STORES = ("redis", "cluster")
"""Every test runs on the tests' Redis and on the session's Redis Cluster (tests/integration/conftest.py)."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


def item(n: int, member: str = "searcher") -> dict:
    return {
        "work_item_id": f"wi-{n}",
        "message_id": f"msg-{n}",
        "member": member,
        "mailbox_id": f"team::{member}",
        "mode": "handoff",
        "tool_use_id": f"toolu_{n}",
    }


async def running_run(store: RunStore, run_id: str = "run-1") -> str:
    await store.create(run_id, "team", "prompt")
    assert await store.set_status(run_id, "running", expect="queued")
    return run_id


# -- records ---------------------------------------------------------------------------------------


async def test_create_and_get_round_trip_every_field(store, raw, prefix):
    parent = {"run_id": "parent-run", "message_id": "m-1", "mailbox_id": "outer::engineering"}
    created = await store.create(
        "run-1",
        "team",
        "hello ✓",
        team_ref="lattice_worker.examples.team:team",
        metadata={"ticket": 7},
        parent=parent,
    )
    got = await store.get("run-1")
    assert got == created
    assert got.status is RunStatus.QUEUED
    assert (got.team, got.team_ref, got.prompt, got.metadata) == (
        "team",
        "lattice_worker.examples.team:team",
        "hello ✓",
        {"ticket": 7},
    )
    assert got.parent is not None and got.parent.model_dump() == parent
    assert got.created_at == got.updated_at > 1_600_000_000_000  # milliseconds
    assert got.result is None and got.max_active is None
    # one hash per run, under the run's hash tag, plus the two indexes
    assert raw.type(f"{prefix}:run:{{run:run-1}}") == "hash"
    assert raw.zscore(f"{prefix}:runs", "run-1") == got.created_at
    assert raw.zscore(f"{prefix}:runs:team:team", "run-1") == got.created_at
    assert await store.get("other") is None


async def test_duplicate_run_id_is_refused_and_nothing_is_overwritten(store):
    await store.create("run-1", "team", "first")
    with pytest.raises(ValueError, match="already exists"):
        await store.create("run-1", "other-team", "second")
    got = await store.get("run-1")
    assert (got.team, got.prompt) == ("team", "first")
    assert [r.run_id for r in await store.list_runs("other-team")] == []


@pytest.mark.parametrize("bad", ["", "has space", "a{b}", "x" * 129, "new\nline", "ü"])
async def test_malformed_run_ids_are_refused_before_any_write(store, raw, prefix, bad):
    with pytest.raises(ValueError, match="invalid run id"):
        await store.create(bad, "team", "p")
    assert list(raw.scan_iter(match=f"{prefix}:*")) == []


async def test_bad_create_input_writes_nothing(store, raw, prefix):
    with pytest.raises(ValueError, match="metadata"):
        await store.create("run-1", "team", "p", metadata={"x": object()})
    with pytest.raises(ValueError, match="metadata must be a dict"):
        await store.create("run-1", "team", "p", metadata=["x"])
    with pytest.raises(ValueError, match="invalid parent"):
        await store.create("run-1", "team", "p", parent={"run_id": "x"})
    with pytest.raises(ValueError, match="team"):
        await store.create("run-1", "", "p")
    assert list(raw.scan_iter(match=f"{prefix}:*")) == []


async def test_prefix_is_validated(state_url):
    with pytest.raises(ValueError, match="key prefix"):
        RunStore(state_url, prefix="bad prefix")
    with pytest.raises(ValueError, match="key prefix"):
        RunStore(state_url, prefix="")


async def test_set_status_compare_and_set(store):
    await store.create("run-1", "team", "p")
    assert not await store.set_status("run-1", "running", expect="suspended")
    assert (await store.get("run-1")).status is RunStatus.QUEUED
    assert await store.set_status("run-1", RunStatus.RUNNING, expect="queued")
    assert (await store.get("run-1")).status is RunStatus.RUNNING
    assert not await store.set_status("run-1", "running", expect="queued")  # second CAS loses
    assert await store.set_status("run-1", "suspended")  # no expect: unconditional
    assert (await store.get("run-1")).status is RunStatus.SUSPENDED
    assert not await store.set_status("missing", "running")


async def test_set_status_refuses_bad_values_and_final_states(store):
    await store.create("run-1", "team", "p")
    with pytest.raises(ValueError, match="unknown run status"):
        await store.set_status("run-1", "bogus")
    with pytest.raises(ValueError, match="finish\\(\\) or cancel\\(\\)"):
        await store.set_status("run-1", "completed")
    assert (await store.get("run-1")).status is RunStatus.QUEUED
    await store.cancel("run-1")
    assert not await store.set_status("run-1", "running")  # a cancelled run stays cancelled
    assert (await store.get("run-1")).status is RunStatus.CANCELLED


# -- work items ------------------------------------------------------------------------------------


async def test_add_items_dispatches_at_most_max_active_in_registration_order(store):
    run_id = await running_run(store)
    first = await store.add_items(run_id, [item(1), item(2), item(3), item(4), item(5)], max_active=2)
    assert first == [item(1), item(2)]
    assert (await store.get(run_id)).max_active == 2
    # completing a dispatched item hands out exactly the next one
    done = await store.complete_item(run_id, "wi-1", {"status": "done"})
    assert done == CompleteResult(resume=False, dispatch=[item(3)], recorded=True)
    # completing an item that was never dispatched frees no slot and removes it from the queue
    skipped = await store.complete_item(run_id, "wi-5", {"status": "cancelled"})
    assert skipped == CompleteResult(resume=False, dispatch=[], recorded=True)
    assert (await store.complete_item(run_id, "wi-2", {})).dispatch == [item(4)]
    assert (await store.complete_item(run_id, "wi-3", {})).dispatch == []  # wi-5 is not dispatched any more
    states = {i["work_item_id"]: i["state"] for i in await store.items(run_id)}
    assert states == {"wi-1": "done", "wi-2": "done", "wi-3": "done", "wi-4": "dispatched", "wi-5": "done"}


async def test_add_items_is_idempotent_per_item_id_and_later_batches_queue_behind(store):
    run_id = await running_run(store)
    assert await store.add_items(run_id, [item(1)], max_active=1) == [item(1)]
    # re-registering the same id neither duplicates nor re-dispatches it
    assert await store.add_items(run_id, [item(1), item(2)], max_active=1) == []
    assert [i["work_item_id"] for i in await store.items(run_id)] == ["wi-1", "wi-2"]
    # raising the bound dispatches the waiting item at once
    assert await store.add_items(run_id, [], max_active=2) == [item(2)]


async def test_add_items_bad_input_writes_nothing(store):
    run_id = await running_run(store)
    with pytest.raises(ValueError, match="max_active"):
        await store.add_items(run_id, [item(1)], max_active=0)
    with pytest.raises(ValueError, match="max_active"):
        await store.add_items(run_id, [item(1)], max_active=True)
    with pytest.raises(ValueError, match="appears twice"):
        await store.add_items(run_id, [item(1), item(1)], max_active=1)
    with pytest.raises(ValueError, match="invalid work item #1"):
        await store.add_items(run_id, [item(1), {"work_item_id": "wi-2"}], max_active=1)
    with pytest.raises(ValueError, match="must be a dict"):
        await store.add_items(run_id, ["wi-1"], max_active=1)
    with pytest.raises(ValueError, match="not JSON-serialisable"):
        await store.add_items(run_id, [{**item(1), "extra": {1, 2}}], max_active=1)
    assert await store.items(run_id) == []
    with pytest.raises(RunNotFoundError):
        await store.add_items("missing", [item(1)], max_active=1)


async def test_extra_item_fields_are_kept(store):
    run_id = await running_run(store)
    extended = {**item(1), "thread_id": "th-1", "depth": 2}
    assert await store.add_items(run_id, [extended], max_active=1) == [extended]
    [listed] = await store.items(run_id)
    assert listed == {**extended, "state": "dispatched", "outcome": None}


async def test_complete_item_is_idempotent_and_keeps_the_first_outcome(store):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1), item(2)], max_active=1)
    assert (await store.complete_item(run_id, "wi-1", {"report": "first"})).dispatch == [item(2)]
    again = await store.complete_item(run_id, "wi-1", {"report": "second"})
    assert again == CompleteResult(resume=False, dispatch=[], recorded=False)
    unknown = await store.complete_item(run_id, "wi-404", {"report": "x"})
    assert unknown == CompleteResult(resume=False, dispatch=[], recorded=False)
    items = await store.items(run_id)
    assert [(i["work_item_id"], i["state"], i["outcome"]) for i in items] == [
        ("wi-1", "done", {"report": "first"}),
        ("wi-2", "dispatched", None),
    ]
    with pytest.raises(ValueError, match="outcome must be a dict"):
        await store.complete_item(run_id, "wi-2", "done")
    assert (await store.items(run_id))[1]["state"] == "dispatched"


async def test_concurrent_duplicate_completions_record_exactly_once(prefix, state_url):
    stores = [RunStore(state_url, prefix=prefix) for _ in range(2)]
    try:
        run_id = await running_run(stores[0])
        await stores[0].add_items(run_id, [item(1), item(2)], max_active=1)
        assert await stores[0].suspend(run_id)
        results = await asyncio.gather(
            *(stores[n % 2].complete_item(run_id, "wi-1", {"n": n}) for n in range(10))
        )
        assert sum(r.recorded for r in results) == 1
        assert [r.dispatch for r in results if r.recorded] == [[item(2)]]
        assert all(r.dispatch == [] for r in results if not r.recorded)
        assert not any(r.resume for r in results)
    finally:
        for s in stores:
            await s.aclose()


# -- suspension and resume -------------------------------------------------------------------------


async def test_suspend_with_an_empty_wait_set_changes_nothing(store):
    run_id = await running_run(store)
    assert await store.suspend(run_id) is False
    assert (await store.get(run_id)).status is RunStatus.RUNNING


async def test_suspend_then_last_completion_resumes_exactly_once(store):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1), item(2)], max_active=2)
    assert await store.suspend(run_id) is True
    assert (await store.get(run_id)).status is RunStatus.SUSPENDED
    assert await store.suspend(run_id) is True  # repeated: still suspended, nothing else
    assert (await store.complete_item(run_id, "wi-1", {})).resume is False
    assert (await store.get(run_id)).status is RunStatus.SUSPENDED
    assert (await store.complete_item(run_id, "wi-2", {})).resume is True
    assert (await store.get(run_id)).status is RunStatus.RESUMING
    assert (await store.complete_item(run_id, "wi-2", {})).resume is False  # duplicate completion
    assert await store.begin_resume(run_id) is True
    assert await store.begin_resume(run_id) is False  # a duplicated resume task
    assert (await store.get(run_id)).status is RunStatus.RUNNING


async def test_items_completed_before_suspend_mean_no_suspension(store):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1)], max_active=1)
    assert (await store.complete_item(run_id, "wi-1", {})).resume is False  # run still running
    assert await store.suspend(run_id) is False  # the caller continues at once
    assert (await store.get(run_id)).status is RunStatus.RUNNING


async def test_suspend_refuses_runs_that_are_not_running(store):
    await store.create("run-1", "team", "p")
    await store.add_items("run-1", [item(1)], max_active=1)
    with pytest.raises(RunStateError, match="queued") as info:
        await store.suspend("run-1")
    assert info.value.status == "queued"
    await store.cancel("run-1")
    with pytest.raises(RunStateError, match="cancelled"):
        await store.suspend("run-1")
    with pytest.raises(RunNotFoundError):
        await store.suspend("missing")


async def test_race_between_suspend_and_last_completion_never_loses_or_doubles_a_wakeup(prefix, state_url):
    """Suspend and the completions run concurrently on separate connections; in
    every round exactly one side continues the run: either suspend sees an empty
    wait set (False) or exactly one completion reports resume=True."""
    lead_side, member_side = RunStore(state_url, prefix=prefix), RunStore(state_url, prefix=prefix)
    rng = random.Random(1234)
    paths = {"suspend_saw_empty": 0, "completion_resumed": 0}

    async def jitter(coro):
        await asyncio.sleep(rng.random() * 0.002)
        return await coro

    try:
        for round_no in range(300):
            run_id = await running_run(lead_side, f"race-{round_no}")
            n_items = rng.randint(1, 3)
            await lead_side.add_items(run_id, [item(i) for i in range(n_items)], max_active=n_items)
            suspended, *completions = await asyncio.gather(
                jitter(lead_side.suspend(run_id)),
                *(jitter(member_side.complete_item(run_id, f"wi-{i}", {"i": i})) for i in range(n_items)),
            )
            resumes = sum(c.resume for c in completions)
            assert all(c.recorded for c in completions)
            assert int(not suspended) + resumes == 1, (round_no, suspended, resumes)
            status = (await lead_side.get(run_id)).status
            if suspended:
                paths["completion_resumed"] += 1
                assert status is RunStatus.RESUMING
                assert await lead_side.begin_resume(run_id)
            else:
                paths["suspend_saw_empty"] += 1
                assert status is RunStatus.RUNNING
        # both interleavings really happened
        assert paths["suspend_saw_empty"] > 0 and paths["completion_resumed"] > 0, paths
    finally:
        await lead_side.aclose()
        await member_side.aclose()


async def test_concurrent_workers_under_max_active_dispatch_each_item_exactly_once(prefix, state_url):
    stores = [RunStore(state_url, prefix=prefix) for _ in range(4)]
    try:
        run_id = await running_run(stores[0])
        n = 40
        dispatched: list[str] = []
        queue: asyncio.Queue[dict] = asyncio.Queue()
        for d in await stores[0].add_items(run_id, [item(i) for i in range(n)], max_active=3):
            dispatched.append(d["work_item_id"])
            queue.put_nowait(d)
        assert len(dispatched) == 3
        assert await stores[0].suspend(run_id)
        resumes = 0
        completed = 0

        async def worker(s: RunStore) -> None:
            nonlocal resumes, completed
            while completed < n:
                try:
                    d = await asyncio.wait_for(queue.get(), timeout=0.05)
                except TimeoutError:
                    continue
                result = await s.complete_item(run_id, d["work_item_id"], {"by": id(s)})
                completed += 1
                resumes += result.resume
                for nxt in result.dispatch:
                    dispatched.append(nxt["work_item_id"])
                    queue.put_nowait(nxt)

        await asyncio.wait_for(asyncio.gather(*(worker(s) for s in stores)), timeout=30)
        assert sorted(dispatched) == sorted(f"wi-{i}" for i in range(n))  # each once, none lost
        assert resumes == 1
        assert (await stores[0].get(run_id)).status is RunStatus.RESUMING
    finally:
        for s in stores:
            await s.aclose()


async def test_items_and_clear_items_keep_unfinished_work(store):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1), item(2), item(3)], max_active=1)
    await store.complete_item(run_id, "wi-1", {"text": "one"})
    listed = await store.items(run_id)
    assert [(i["work_item_id"], i["state"], i["outcome"]) for i in listed] == [
        ("wi-1", "done", {"text": "one"}),
        ("wi-2", "dispatched", None),
        ("wi-3", "queued", None),
    ]
    assert await store.clear_items(run_id) == 1
    assert [i["work_item_id"] for i in await store.items(run_id)] == ["wi-2", "wi-3"]
    assert (await store.complete_item(run_id, "wi-1", {})).recorded is False  # forgotten
    assert (await store.complete_item(run_id, "wi-2", {})).dispatch == [item(3)]
    await store.complete_item(run_id, "wi-3", {})
    assert await store.clear_items(run_id) == 2
    assert await store.items(run_id) == []


# -- events, finish, cancel ------------------------------------------------------------------------


async def test_events_are_appended_in_order_and_read_after_an_id(store):
    run_id = await running_run(store)
    ids = [await store.append_event(run_id, {"type": "agent_message", "n": n}) for n in range(5)]
    got = await store.events(run_id)
    assert [eid for eid, _ in got] == ids
    assert [e["n"] for _, e in got] == [0, 1, 2, 3, 4]
    assert [e["n"] for _, e in await store.events(run_id, ids[2])] == [3, 4]
    assert [e["n"] for _, e in await store.events(run_id, count=2)] == [0, 1]
    assert await store.events(run_id, ids[-1], block_ms=50) == []


async def test_blocking_event_read_wakes_up_on_append(prefix, state_url):
    reader, writer = RunStore(state_url, prefix=prefix), RunStore(state_url, prefix=prefix)
    try:
        run_id = await running_run(writer)
        read = asyncio.create_task(reader.events(run_id, "0-0", block_ms=10_000))
        await asyncio.sleep(0.05)
        assert not read.done()
        await writer.append_event(run_id, {"type": "ping"})
        got = await asyncio.wait_for(read, timeout=5)
        assert [e for _, e in got] == [{"type": "ping"}]
    finally:
        await reader.aclose()
        await writer.aclose()


async def test_append_event_refuses_unknown_runs_and_bad_events(store, raw, prefix):
    with pytest.raises(RunNotFoundError):
        await store.append_event("missing", {"type": "x"})
    assert not raw.exists(f"{prefix}:run:{{run:missing}}:events")
    run_id = await running_run(store)
    for bad in ({"no": "type"}, {"type": 3}, ["type"], {"type": "x", "v": float("nan")}):
        with pytest.raises(ValueError):
            await store.append_event(run_id, bad)
    assert await store.events(run_id) == []


async def test_event_stream_length_is_bounded(prefix, raw, state_url):
    store = RunStore(state_url, prefix=prefix, max_events=10)
    try:
        run_id = await running_run(store)
        for n in range(400):
            await store.append_event(run_id, {"type": "tick", "n": n})
        length = raw.xlen(f"{prefix}:run:{{run:{run_id}}}:events")
        assert 10 <= length < 400  # approximate trimming (MAXLEN ~)
        newest = await store.events(run_id, count=1000)
        assert newest[-1][1]["n"] == 399
    finally:
        await store.aclose()


async def test_finish_stores_the_result_and_appends_one_run_result_event(store):
    run_id = await running_run(store)
    result = RunResult(run_id=run_id, status="completed", result="42", usage={"input_tokens": 3})
    assert await store.finish(run_id, result) is True
    record = await store.get(run_id)
    assert record.status is RunStatus.COMPLETED and record.result == result
    # a second finish (e.g. a redelivered task) is refused and appends nothing
    assert await store.finish(run_id, RunResult(run_id=run_id, status="failed", error="late")) is False
    assert (await store.get(run_id)).result == result
    events = [e for _, e in await store.events(run_id)]
    assert events == [{"type": "run_result", **result.model_dump(mode="json")}]
    # and a finished run cannot be cancelled any more
    assert await store.cancel(run_id) == []
    assert (await store.get(run_id)).status is RunStatus.COMPLETED


async def test_finish_validates_its_result(store):
    run_id = await running_run(store)
    with pytest.raises(ValueError, match="does not match"):
        await store.finish(run_id, RunResult(run_id="other", status="completed"))
    with pytest.raises(ValueError, match="use cancel"):
        await store.finish(run_id, RunResult(run_id=run_id, status="cancelled"))
    with pytest.raises(RunNotFoundError):
        await store.finish("missing", RunResult(run_id="missing", status="failed"))
    assert (await store.get(run_id)).status is RunStatus.RUNNING
    assert await store.events(run_id) == []


async def test_cancel_returns_unfinished_items_and_stops_dispatching(store):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1), item(2), item(3)], max_active=1)
    await store.complete_item(run_id, "wi-1", {})  # dispatches wi-2; wi-3 stays queued
    assert await store.suspend(run_id)
    unfinished = await store.cancel(run_id, reason="user asked")
    assert unfinished == [item(2), item(3)]
    record = await store.get(run_id)
    assert record.status is RunStatus.CANCELLED
    assert record.result == RunResult(run_id=run_id, status="cancelled", error="user asked")
    events = [e for _, e in await store.events(run_id)]
    assert events == [{"type": "run_result", **record.result.model_dump(mode="json")}]
    # a completion after the cancel is recorded but dispatches and resumes nothing
    late = await store.complete_item(run_id, "wi-2", {"status": "cancelled"})
    assert late == CompleteResult(resume=False, dispatch=[], recorded=True)
    assert await store.add_items(run_id, [item(4)], max_active=5) == []
    assert not await store.begin_resume(run_id)
    # a second cancel appends nothing but lists what is still unfinished
    assert await store.cancel(run_id) == [item(3), item(4)]
    assert len(await store.events(run_id)) == 1
    assert await store.finish(run_id, RunResult(run_id=run_id, status="completed")) is False
    with pytest.raises(RunNotFoundError):
        await store.cancel("missing")


# -- listing, deletion, loops ----------------------------------------------------------------------


async def test_list_runs_newest_first_per_team_with_limit(store, raw, prefix):
    for n, team in enumerate(["a", "b", "a", "a"]):
        await store.create(f"run-{n}", team, "p")
        await asyncio.sleep(0.002)  # distinct creation milliseconds
    assert [r.run_id for r in await store.list_runs()] == ["run-3", "run-2", "run-1", "run-0"]
    assert [r.run_id for r in await store.list_runs("a")] == ["run-3", "run-2", "run-0"]
    assert [r.run_id for r in await store.list_runs("a", limit=2)] == ["run-3", "run-2"]
    assert await store.list_runs("nobody") == []
    with pytest.raises(ValueError):
        await store.list_runs(limit=0)
    # an index entry whose record vanished is dropped
    raw.delete(f"{prefix}:run:{{run:run-2}}")
    assert [r.run_id for r in await store.list_runs("a")] == ["run-3", "run-0"]
    assert raw.zscore(f"{prefix}:runs:team:a", "run-2") is None


async def test_delete_removes_every_key_of_the_run(store, raw, prefix):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1)], max_active=1)
    await store.append_event(run_id, {"type": "x"})
    await store.create("keep", "team", "p")
    assert await store.delete(run_id) is True
    assert await store.delete(run_id) is False
    left = sorted(raw.scan_iter(match=f"{prefix}:run:{{run:{run_id}}}*"))
    assert left == []
    assert [r.run_id for r in await store.list_runs()] == ["keep"]


async def test_one_store_serves_several_event_loops(store):
    """A store built from a URL makes one client per running loop, so it can be
    used from another thread's loop while this loop uses it too."""
    run_id = await running_run(store)
    seen: list[object] = []

    def other_thread() -> None:
        async def use() -> None:
            await store.append_event(run_id, {"type": "from-thread"})
            seen.append(await store.redis())
            await store.aclose()

        asyncio.run(use())

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join(timeout=10)
    mine = await store.redis()
    assert seen and seen[0] is not mine
    assert [e["type"] for _, e in await store.events(run_id)] == ["from-thread"]


async def test_a_passed_in_client_is_used_and_left_open(prefix, state_url):
    # bytes replies: the store decodes them itself (a cluster client on the cluster)
    client = async_redis(state_url) if "cluster" in state_url else Redis.from_url(state_url)
    try:
        store = RunStore(client, prefix=prefix)
        run_id = await running_run(store)
        await store.add_items(run_id, [item(1)], max_active=1)
        assert (await store.get(run_id)).status is RunStatus.RUNNING
        assert [i["work_item_id"] for i in await store.items(run_id)] == ["wi-1"]
        await store.append_event(run_id, {"type": "x"})
        assert [e for _, e in await store.events(run_id)] == [{"type": "x"}]
        await store.aclose()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_scripts_keep_every_key_of_a_run_under_one_hash_tag(store, raw, prefix):
    run_id = await running_run(store)
    await store.add_items(run_id, [item(1), item(2)], max_active=1)
    await store.append_event(run_id, {"type": "x"})
    keys = sorted(k for k in raw.scan_iter(match=f"{prefix}:run:*"))
    assert len(keys) >= 7
    assert {k.split("{", 1)[1].split("}", 1)[0] for k in keys} == {"run:run-1"}  # one hash tag, one slot
    stored = json.loads(raw.hget(f"{prefix}:run:{{run:run-1}}:items", "wi-1"))
    assert stored == item(1)
