"""The run writer's flush under many concurrent steps (one writer per event loop).

A flush waits until what was queued when it was called is written, and no
longer: under load (1,000 steps in flight on one asyncio pool process) the
queue is never empty, and a flush that waited for an empty queue kept its
step waiting, and every waiting flush was woken after every batch
(``bench/distributed.py`` (b)).
"""

from __future__ import annotations

import asyncio

import pytest

from lattice_worker.runtime.run.writer import RunWriter

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


async def test_a_flush_returns_once_its_writes_are_written_while_others_keep_queueing(state_url, prefix, raw):
    writer = RunWriter(state_url, 100)
    stop = asyncio.Event()

    async def flood(n: int) -> int:  # other steps queueing writes all the time
        count = 0
        while not stop.is_set():
            writer.queue_write([("incr", f"{prefix}:flood:{n}")])
            count += 1
            await asyncio.sleep(0.001 if n % 2 else 0)
        await writer.flush()
        return count

    try:
        floods = [asyncio.create_task(flood(n)) for n in range(4)]
        await asyncio.sleep(0.2)
        writer.queue_write([("set", f"{prefix}:mine", "1")])
        try:
            await asyncio.wait_for(writer.flush(), 3)
        except TimeoutError:
            pytest.fail("the flush waits for the writes queued after it (the floods'), not only its own")
        assert raw.get(f"{prefix}:mine") == "1"  # written when the flush returned
        assert not any(f.done() for f in floods)
        stop.set()
        counts = await asyncio.gather(*floods)
        for n, count in enumerate(counts):
            assert int(raw.get(f"{prefix}:flood:{n}") or 0) == count
    finally:
        stop.set()
        await writer.aclose()


async def test_every_concurrent_flush_sees_its_own_write_written(state_url, prefix, raw):
    writer = RunWriter(state_url, 100)

    async def step(i: int) -> bool:
        await asyncio.sleep(0)
        writer.queue_write([("set", f"{prefix}:k{i}", str(i))])
        if i % 3 == 0:
            await writer.write([("get", f"{prefix}:k{i}")])
        await writer.flush()
        return raw.get(f"{prefix}:k{i}") == str(i)

    try:
        assert all(await asyncio.gather(*(step(i) for i in range(300))))
    finally:
        await writer.aclose()


async def test_a_cancelled_flush_leaves_the_others_to_finish(state_url, prefix, raw):
    writer = RunWriter(state_url, 100)

    async def step(i: int) -> None:
        writer.queue_write([("set", f"{prefix}:c{i}", "1")])
        await writer.flush()

    try:
        tasks = [asyncio.create_task(step(i)) for i in range(100)]
        await asyncio.sleep(0)
        for task in tasks[1:50:2]:
            task.cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        await asyncio.wait_for(writer.flush(), 5)
        assert sum(raw.exists(f"{prefix}:c{i}") for i in range(100)) == 100
    finally:
        await writer.aclose()
