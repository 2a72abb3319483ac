"""The run's result stream (``R:result``) and ``wait`` on it, against the real Redis.

Every writer of the ``run_result`` event (finish, cancel, recover_lead's
"fail") also appends it to the result stream, and ``AsyncLatticeClient.wait``
blocks on that stream only: the run's other events never wake it. Runs without
a result stream (finished before it existed, or by a writer that knows none)
still return from the record. No worker runs here; the tests play its part
through the RunStore. Each test has its own key prefix (deleted afterwards).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from lattice_client import AsyncLatticeClient, LatticeClient, RunNotFoundError, RunResult, RunStore
from tests.support.registry import publish_fake_worker
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def client(prefix, raw):
    publish_fake_worker(prefix, {"example": "example"})
    c = AsyncLatticeClient(REDIS_URL, key_prefix=prefix)
    yield c
    await c.aclose()


@pytest.fixture
async def store(prefix):
    s = RunStore(REDIS_URL, prefix=prefix)
    yield s
    await s.aclose()


def result_entries(raw: Any, store: RunStore, run_id: str) -> list[dict[str, str]]:
    return [fields for _, fields in raw.xrange(store.result_key(run_id))]


async def spy_xread(client: AsyncLatticeClient, calls: list[tuple[list[str], bool]]) -> None:
    """Record every XREAD of the client's Redis connection: (stream keys, got entries)."""
    redis = await client.runs.redis()
    original = redis.xread

    async def xread(streams: dict[str, str], *args: Any, **kwargs: Any) -> Any:
        reply = await original(streams, *args, **kwargs)
        calls.append((list(streams), bool(reply)))
        return reply

    redis.xread = xread  # type: ignore[method-assign]


async def test_wait_wakes_once_for_the_result_and_never_reads_the_events(client, store, raw):
    handle = await client.submit("example", "hi")
    run_id = handle.run_id
    expected = RunResult(run_id=run_id, status="completed", result="42", usage={"output_tokens": 5})
    calls: list[tuple[list[str], bool]] = []
    await spy_xread(client, calls)

    async def play() -> None:
        await asyncio.sleep(0.2)
        await store.set_status(run_id, "running")
        for n in range(5):
            await store.append_events(run_id, [{"type": "assistant", "n": n}, {"type": "user", "n": n}])
            await asyncio.sleep(0.02)
        assert await store.finish(run_id, expected)

    waiter = asyncio.create_task(handle.wait(timeout=30))
    await play()
    assert await waiter == expected
    # only the result stream was read, and exactly one read returned something: the result
    assert calls and all(keys == [store.result_key(run_id)] for keys, _ in calls)
    assert [got for _, got in calls].count(True) == 1 and calls[-1][1]
    assert len(result_entries(raw, store, run_id)) == 1
    # the events stream still has everything, ending with the run_result
    events = [e async for e in client.events(run_id, timeout=5)]
    assert [e["type"] for e in events] == ["assistant", "user"] * 5 + ["run_result"]
    # waiting again returns at once (from the record), the stream keeps one entry
    assert await client.wait(run_id, timeout=0) == expected
    assert await store.read_result(run_id) == expected


async def test_a_failed_run_wakes_a_waiter(client, store, raw):
    handle = await client.submit("example", "hi")
    waiter = asyncio.create_task(handle.wait(timeout=30))
    await asyncio.sleep(0.1)
    failed = RunResult(run_id=handle.run_id, status="failed", error="boom")
    assert await store.finish(handle.run_id, failed)
    assert await waiter == failed
    assert not await store.finish(handle.run_id, failed)  # refused: nothing appended twice
    assert len(result_entries(raw, store, handle.run_id)) == 1


async def test_cancel_wakes_a_waiter_once(client, store, raw):
    handle = await client.submit("example", "hi")
    waiter = asyncio.create_task(handle.wait(timeout=30))
    await asyncio.sleep(0.1)
    report = await client.cancel(handle.run_id)
    result = await waiter
    assert report.status.value == "cancelled"
    assert result.status == "cancelled" and result.error == "cancelled by request"
    await client.cancel(handle.run_id)  # idempotent: no second result entry
    assert len(result_entries(raw, store, handle.run_id)) == 1
    assert await store.read_result(handle.run_id) == result


async def test_a_lead_failed_by_recovery_wakes_a_waiter(client, store, raw):
    handle = await client.submit("example", "hi")
    run_id = handle.run_id
    segment = await store.begin_segment(run_id, expect="queued", lease_s=30)
    assert segment is not None
    waiter = asyncio.create_task(handle.wait(timeout=30))
    await asyncio.sleep(0.1)
    recovery = await store.recover_lead(run_id, max_attempts=1, now=segment.lease_until + 1)
    assert recovery.action == "failed"
    result = await waiter
    assert result.status == "failed" and result == recovery.result
    assert len(result_entries(raw, store, run_id)) == 1


async def test_a_requeued_lead_does_not_wake_a_waiter(client, store, raw):
    handle = await client.submit("example", "hi")
    run_id = handle.run_id
    segment = await store.begin_segment(run_id, expect="queued", lease_s=30)
    assert segment is not None
    recovery = await store.recover_lead(run_id, max_attempts=3, now=segment.lease_until + 1)
    assert recovery.action == "requeued"
    assert result_entries(raw, store, run_id) == []
    with pytest.raises(TimeoutError):
        await handle.wait(timeout=0.3)


async def test_a_run_without_a_result_stream_returns_from_the_record(client, store, raw):
    handle = await client.submit("example", "hi")
    result = RunResult(run_id=handle.run_id, status="completed", result="kept")
    assert await store.finish(handle.run_id, result)
    raw.delete(store.result_key(handle.run_id), store.keys(handle.run_id).events)
    assert await handle.wait(timeout=1) == result
    assert await store.read_result(handle.run_id) is None


async def test_a_run_finished_without_a_result_stream_while_waiting_still_returns(client, store, raw):
    # a writer that knows no result stream (a worker of an older version): record + events only
    handle = await client.submit("example", "hi")
    run_id = handle.run_id
    waiter = asyncio.create_task(handle.wait(timeout=30))
    await asyncio.sleep(0.2)
    result = RunResult(run_id=run_id, status="completed", result="old worker")
    record = store.keys(run_id).record
    raw.hset(record, mapping={"status": "completed", "result": result.model_dump_json()})
    raw.xadd(store.keys(run_id).events, {"data": '{"type": "run_result"}'})
    assert await waiter == result


async def test_a_run_deleted_while_waiting_raises_run_not_found(client, store):
    handle = await client.submit("example", "hi")
    waiter = asyncio.create_task(handle.wait(timeout=30))
    await asyncio.sleep(0.2)
    assert await store.delete(handle.run_id)
    with pytest.raises(RunNotFoundError):
        await waiter


async def test_delete_removes_the_result_stream(store, raw):
    await store.create("r1", "example", "hi")
    assert await store.finish("r1", RunResult(run_id="r1", status="completed", result="x"))
    assert raw.exists(store.result_key("r1"))
    assert await store.delete("r1")
    assert not raw.exists(store.result_key("r1"))


# -- the blocking client's wait (reads from the calling thread) -------------------------------------


@pytest.fixture
def sync_client(prefix, raw):
    publish_fake_worker(prefix, {"example": "example"})
    c = LatticeClient(REDIS_URL, key_prefix=prefix)
    yield c
    c.close()


def in_thread(fn: Any, delay: float) -> threading.Thread:
    def main() -> None:
        time.sleep(delay)
        fn()

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread


def test_blocking_wait_wakes_for_the_result_cancel_and_an_old_style_finish(sync_client, raw, prefix):
    store = RunStore(REDIS_URL, prefix=prefix)
    handle = sync_client.submit("example", "hi")
    expected = RunResult(run_id=handle.run_id, status="completed", result="42")
    in_thread(lambda: asyncio.run(_finish(prefix, expected)), 0.2)
    assert handle.wait(timeout=30) == expected
    assert sync_client.wait(handle.run_id, timeout=0) == expected

    cancelled = sync_client.submit("example", "hi")
    in_thread(lambda: sync_client.cancel(cancelled.run_id), 0.2)
    result = cancelled.wait(timeout=30)
    assert result.status == "cancelled" and result.error == "cancelled by request"

    old = sync_client.submit("example", "hi")  # finished by a writer that knows no result stream
    old_result = RunResult(run_id=old.run_id, status="failed", error="old worker")
    record = store.keys(old.run_id).record
    in_thread(
        lambda: raw.hset(record, mapping={"status": "failed", "result": old_result.model_dump_json()}), 0.2
    )
    assert old.wait(timeout=30) == old_result


def test_blocking_wait_timeouts_unknown_and_deleted_runs(sync_client, prefix):
    handle = sync_client.submit("example", "hi")
    with pytest.raises(TimeoutError, match="did not finish within 0.2 s"):
        handle.wait(timeout=0.2)
    with pytest.raises(TimeoutError):
        handle.wait(timeout=0)
    for bad in (-1, float("nan"), "5", True):
        with pytest.raises(ValueError, match="timeout must be"):
            handle.wait(timeout=bad)
    # inf is no limit: the wait goes on until the run ends (here, cancelled from a thread)
    endless = sync_client.submit("example", "no limit")
    in_thread(lambda: sync_client.cancel(endless.run_id), 0.5)
    assert endless.wait(timeout=float("inf")).status == "cancelled"
    with pytest.raises(RunNotFoundError):
        sync_client.wait("nope", timeout=1)
    with pytest.raises(ValueError, match="invalid run id"):
        sync_client.wait("bad id", timeout=1)
    in_thread(lambda: asyncio.run(_delete(prefix, handle.run_id)), 0.2)
    with pytest.raises(RunNotFoundError):
        handle.wait(timeout=30)
    sync_client.close()
    with pytest.raises(RuntimeError, match="closed"):
        sync_client.wait(handle.run_id, timeout=1)


async def _finish(prefix: str, result: RunResult) -> None:
    store = RunStore(REDIS_URL, prefix=prefix)
    try:
        assert await store.finish(result.run_id, result)
    finally:
        await store.aclose()


async def _delete(prefix: str, run_id: str) -> None:
    store = RunStore(REDIS_URL, prefix=prefix)
    try:
        assert await store.delete(run_id)
    finally:
        await store.aclose()
