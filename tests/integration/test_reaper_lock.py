"""The reaper lock (``runtime/reaper/lock.py``): held by one sweep for half a lease,
renewed and released by its holder only, renewed while the sweep runs; a sweep
that lost it stops writing. Real Redis, one key prefix per test (deleted afterwards)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from lattice_client.celery_config import DELIVER_TASK
from lattice_worker.runtime.reaper import sweep as reaper
from lattice_worker.runtime.reaper.lock import ReaperLock, ReaperLockLostError, lock_hold_seconds, lock_key
from tests.integration import test_reaper_orphans
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

env = test_reaper_orphans.env
"""A worker context on the e2e teams and its task collector (``test_reaper_orphans``)."""


prefix = test_reaper_orphans.prefix
"""The unique prefix, also as ``LATTICE_KEY_PREFIX`` (``test_reaper_orphans``)."""


@pytest.fixture
async def client():
    c = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield c
    await c.aclose()


def test_the_hold_is_half_a_lease():
    assert lock_hold_seconds(30) == 15.0
    assert lock_hold_seconds(0.001) == 0.01
    with pytest.raises(ValueError, match="lease_s must be a positive number"):
        ReaperLock(None, "p", "w", 0)


async def test_one_holder_at_a_time_and_only_it_renews_or_releases(client, prefix):
    key = lock_key(prefix)
    first = ReaperLock(client, prefix, "worker-a", 2.0)
    second = ReaperLock(client, prefix, "worker-b", 2.0)
    assert await first.acquire() and first.held
    assert not await second.acquire() and not second.held
    assert await client.get(key) == first.token and first.token.startswith("worker-a:")
    assert 0 < await client.pttl(key) <= 2000

    # another token renews nothing, releases nothing, deletes nothing
    await client.pexpire(key, 500)
    assert await second.renew_once() is False and second.lost
    assert not await second.release(0)
    assert await client.get(key) == first.token and await client.pttl(key) <= 500

    # the holder renews to a full hold, then releases keeping it for a while, then for good
    assert await first.renew_once() is True and first.renewals == 1
    assert 1500 < await client.pttl(key) <= 2000
    assert await first.release(0.3)
    assert await client.get(key) == first.token and 0 < await client.pttl(key) <= 300
    holder = ReaperLock(client, prefix, "worker-a", 2.0)
    assert await holder.acquire() is False  # kept for the interval
    await client.delete(key)
    assert await holder.acquire()
    assert await holder.release(0)
    assert await client.exists(key) == 0


async def test_an_expired_hold_is_lost_and_the_next_holder_keeps_it(client, prefix):
    key = lock_key(prefix)
    first = ReaperLock(client, prefix, "worker-a", 0.2)
    assert await first.acquire()
    await asyncio.sleep(0.3)  # no renewal: it expired in Redis, and by the holder's clock
    assert not first.held
    with pytest.raises(ReaperLockLostError):
        first.check()
    assert await client.exists(key) == 0
    second = ReaperLock(client, prefix, "worker-b", 5.0)
    assert await second.acquire()
    assert await first.renew_once() is False  # never regained
    assert not await first.release(0)
    assert await client.get(key) == second.token and await client.pttl(key) > 4000


async def test_the_hold_is_renewed_while_the_block_runs_and_a_takeover_ends_it(client, prefix):
    key = lock_key(prefix)
    lock = ReaperLock(client, prefix, "worker-a", 2.0)
    assert await lock.acquire()
    async with lock:
        await asyncio.sleep(4.5)  # over two holds
        assert lock.held and lock.renewals >= 2
        assert await client.get(key) == lock.token
        await client.set(key, "someone-else", px=10_000)
        await asyncio.sleep(1.5)  # the next renewal (every third of the hold) finds it taken
        assert not lock.held and lock.lost
    assert await client.get(key) == "someone-else"


async def test_a_sweep_renews_its_lock_while_it_runs(env, client, prefix):
    ctx, broker = env
    # hold 2 s; the lost-doorbell scan pauses 3 s on the member mailbox
    ctx.settings = ctx.settings.with_overrides(lease_seconds=4.0, reaper_scan_pause_seconds=3.0)
    await ctx.mailbox.send("e2e::lead", "e2e::worker", "orphan")
    await asyncio.sleep(4.2)  # pending for over a lease: its doorbell is rung again
    report = await reaper.sweep(ctx, interval_s=0.2)
    assert report is not None and not report.lock_lost
    assert report.rerung == ["e2e::worker"]
    assert [(n, a) for n, a, _ in broker.queue] == [(DELIVER_TASK, ["e2e::worker"])]
    assert 0 < await client.pttl(lock_key(prefix)) <= 200  # kept for the interval


async def test_a_sweep_that_lost_its_lock_stops_writing(env, client, prefix):
    ctx, broker = env
    ctx.settings = ctx.settings.with_overrides(lease_seconds=4.0, reaper_scan_pause_seconds=3.0)
    await ctx.mailbox.send("e2e::lead", "e2e::worker", "orphan")
    await asyncio.sleep(4.2)
    key = lock_key(prefix)
    sweeping = asyncio.create_task(reaper.sweep(ctx, interval_s=0.2))
    for _ in range(100):
        if await client.exists(key):
            break
        await asyncio.sleep(0.01)
    await client.set(key, "another-reaper", px=10_000)  # its hold ran out; another reaper took it
    report = await sweeping
    assert report is not None and report.lock_lost
    assert report.rerung == [] and broker.queue == []
    assert await client.exists(f"{prefix}:reaper:rung:e2e::worker") == 0
    assert await client.get(key) == "another-reaper"  # not released by the loser
