"""The shared token buckets of ``LATTICE_MODEL_LIMITS`` (``lattice_worker/runtime/limits``): the
Lua scripts' semantics on the real Redis -- FIFO turns through debt, settling with usage,
what the provider said lowering the buckets, keys in one hash slot under the prefix, the
API key never in clear (issue 22)."""

from __future__ import annotations

import pytest
from redis.cluster import key_slot

from lattice_client.model_limits import ModelLimit, api_key_id
from lattice_mailbox.connections import async_redis
from lattice_worker.runtime.limits.bucket import LimitKeys, RateLimiter, bucket_tag, index_key, waiting_calls

STATE_STORES = ("redis", "cluster")
"""Every test runs on the tests' Redis and on the session's Redis Cluster (tests/integration/conftest.py)."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

KEY = "sk-ant-test-secret-key"


@pytest.fixture
async def client(state_url):
    c = async_redis(state_url, decode_responses=True)
    yield c
    await c.aclose()


def limiter(client, prefix: str, **limit) -> RateLimiter:
    async def redis():
        return client

    return RateLimiter(redis, prefix, {"m": ModelLimit(**limit)})


async def test_calls_past_the_capacity_get_later_turns_in_order(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=10, period_seconds=1)
    first = [await lim.reserve("m", KEY, 0) for _ in range(10)]
    assert [r.wait_seconds for r in first] == [0.0] * 10
    assert all(r.limit is None for r in first)
    later = [await lim.reserve("m", KEY, 0) for _ in range(3)]
    # 10 per second refill: one turn each 100 ms, in the order asked (a few ms of clock between)
    waits = [r.wait_seconds for r in later]
    assert waits == sorted(waits)
    for n, wait in enumerate(waits, start=1):
        assert 0.1 * n - 0.05 <= wait <= 0.1 * n + 0.001, waits
    assert {r.limit for r in later} == {"requests_per_minute"}
    assert len({r.ticket for r in first + later}) == 13


async def test_the_bucket_refills_with_time(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=5, period_seconds=0.5)
    for _ in range(5):
        await lim.reserve("m", KEY, 0)
    assert (await lim.reserve("m", KEY, 0)).wait_seconds > 0
    import asyncio

    await asyncio.sleep(0.7)  # refilled to capacity (and no more)
    waits = [(await lim.reserve("m", KEY, 0)).wait_seconds for _ in range(6)]
    assert waits[:5] == [0.0] * 5 and waits[5] > 0


async def test_input_tokens_wait_on_their_own_limit_and_settle_gives_back(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=1000, input_tokens_per_minute=1000, period_seconds=1)
    big = await lim.reserve("m", KEY, 1000)
    assert big.wait_seconds == 0
    nxt = await lim.reserve("m", KEY, 500)
    assert nxt.limit == "input_tokens_per_minute"
    assert 0.45 <= nxt.wait_seconds <= 0.5
    # the first call used 100 tokens, not 1000: 900 come back, so a third call does not wait
    levels = await lim.settle(big, input_tokens=100, output_tokens=0)
    assert float(levels[1]) >= 399
    assert (await lim.reserve("m", KEY, 300)).wait_seconds == 0


async def test_output_tokens_in_debt_hold_the_next_call(client, prefix):
    lim = limiter(client, prefix, output_tokens_per_minute=1000, period_seconds=1)
    res = await lim.reserve("m", KEY, 50)
    assert res.wait_seconds == 0
    await lim.settle(res, input_tokens=50, output_tokens=1500)  # 500 in debt
    nxt = await lim.reserve("m", KEY, 50)
    assert nxt.limit == "output_tokens_per_minute"
    assert 0.45 <= nxt.wait_seconds <= 0.5


async def test_an_unused_reservation_is_given_back_whole(client, prefix, raw):
    lim = limiter(client, prefix, requests_per_minute=2, period_seconds=60)
    await lim.reserve("m", KEY, 0)
    second = await lim.reserve("m", KEY, 0)
    third = await lim.reserve("m", KEY, 0)
    assert third.wait_seconds > 25
    keys = LimitKeys.of(prefix, bucket_tag("m", api_key_id(KEY)))
    assert raw.zscore(keys.waiting, third.ticket) is not None
    await lim.settle(third, None, None, used=False)
    assert raw.zscore(keys.waiting, third.ticket) is None
    await lim.settle(second, None, None, used=False)
    assert (await lim.reserve("m", KEY, 0)).wait_seconds == 0


async def test_the_providers_remaining_count_lowers_the_bucket(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=100, input_tokens_per_minute=10_000, period_seconds=1)
    levels = await lim.feed("m", KEY, {"requests": 1, "input_tokens": 50_000})
    assert float(levels[0]) == 1.0
    assert float(levels[1]) == 10_000.0  # a higher count never raises it
    assert (await lim.reserve("m", KEY, 0)).wait_seconds == 0
    assert (await lim.reserve("m", KEY, 0)).wait_seconds > 0


async def test_a_retry_after_holds_every_call_of_the_key(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=6000, period_seconds=60)
    await lim.feed("m", KEY, blocked_seconds=2.0)
    res = await lim.reserve("m", KEY, 0)
    assert res.limit == "requests_per_minute"
    assert 1.9 <= res.wait_seconds <= 2.02
    # another key of the same model is not held
    assert (await lim.reserve("m", "another-key", 0)).wait_seconds == 0


async def test_keys_share_one_hash_slot_under_the_prefix_and_never_hold_the_key(client, prefix, raw):
    lim = limiter(client, prefix, requests_per_minute=1, period_seconds=60)
    await lim.reserve("m", KEY, 10)
    await lim.reserve("m", KEY, 10)
    keys = sorted(raw.scan_iter(match=f"{prefix}:*"))
    assert keys == sorted(
        [
            index_key(prefix),
            f"{prefix}:ratelimit:{{m|{api_key_id(KEY)}}}:bucket",
            f"{prefix}:ratelimit:{{m|{api_key_id(KEY)}}}:waiting",
        ]
    )
    tagged = LimitKeys.of(prefix, bucket_tag("m", api_key_id(KEY)))
    assert key_slot(tagged.bucket.encode()) == key_slot(tagged.waiting.encode())
    dump = repr([raw.dump(k) for k in keys])
    assert "secret" not in dump and KEY not in dump
    assert raw.pttl(tagged.bucket) > 0 and raw.pttl(tagged.waiting) > 0


async def test_waiting_calls_are_listed_per_model_and_key(client, prefix):
    lim = limiter(client, prefix, requests_per_minute=1, period_seconds=60)
    assert await waiting_calls(client, prefix) == []
    for _ in range(3):
        await lim.reserve("m", KEY, 0)
    [entry] = await waiting_calls(client, prefix)
    assert entry["model"] == "m" and entry["key_id"] == api_key_id(KEY)
    assert entry["waiting"] == 2
    assert 110 <= entry["longest_seconds"] <= 120


async def test_a_model_without_a_limit_is_not_limited(client, prefix, raw):
    lim = limiter(client, prefix, requests_per_minute=1)
    assert await lim.reserve("other-model", KEY, 10) is None
    assert await lim.feed("other-model", KEY, blocked_seconds=5) is None
    assert list(raw.scan_iter(match=f"{prefix}:*")) == []
