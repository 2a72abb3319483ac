"""RedisHistoryStore against the real Redis on 127.0.0.1:6379.

Every test uses its own ``test-<uuid>`` key and deletes it afterwards; the
database is never flushed (other engineers share the server).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid

import pytest
import redis
import redis.asyncio as aioredis

from lattice_worker.agent.history import HistoryStore
from lattice_worker.agent.history_stores import RedisHistoryStore
from lattice_worker.errors import ConfigError
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]

USER = {"role": "user", "content": "hello"}
ASSISTANT = {"role": "assistant", "content": [{"type": "text", "text": "hi ✓"}]}


@pytest.fixture
def key():
    name = f"test-{uuid.uuid4()}:history"
    yield name
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        sync.delete(name)
    finally:
        sync.close()


@pytest.fixture
def raw():
    sync = redis.Redis.from_url(REDIS_URL)
    yield sync
    sync.close()


async def test_append_load_round_trip_uses_one_list_element_per_message(key, raw):
    store = RedisHistoryStore(REDIS_URL, key)
    try:
        assert isinstance(store, HistoryStore)
        assert store.fail_on_error is True  # default for the distributed runtime
        assert await store.load() == []
        await store.append(USER)
        await store.append(ASSISTANT)
        assert [json.loads(v) for v in raw.lrange(key, 0, -1)] == [USER, ASSISTANT]
        # a new store over the same key (another worker process) continues the conversation
        other = RedisHistoryStore(REDIS_URL, key)
        assert await other.load() == [USER, ASSISTANT]
        await other.aclose()
    finally:
        await store.aclose()


async def test_replace_rewrites_the_list_and_empty_replace_deletes_it(key, raw):
    store = RedisHistoryStore(REDIS_URL, key, fail_on_error=False)
    try:
        assert store.fail_on_error is False
        for message in (USER, ASSISTANT, USER):
            await store.append(message)
        summary = {"role": "user", "content": "summary"}
        await store.replace([summary, ASSISTANT])
        assert await store.load() == [summary, ASSISTANT]
        await store.replace([])
        assert raw.exists(key) == 0
        assert await store.load() == []
    finally:
        await store.aclose()


async def test_replace_is_one_transaction_readers_never_see_a_partial_list(key):
    store = RedisHistoryStore(REDIS_URL, key)
    old = [{"role": "user", "content": f"old {i}"} for i in range(20)]
    new = [{"role": "user", "content": f"new {i}"} for i in range(20)]
    await store.replace(old)
    reader = RedisHistoryStore(REDIS_URL, key)
    seen: list[list[dict]] = []
    stop = asyncio.Event()

    async def read_loop() -> None:
        while not stop.is_set():
            seen.append(await reader.load())

    task = asyncio.create_task(read_loop())
    try:
        for i in range(40):
            await store.replace(new if i % 2 == 0 else old)
            await asyncio.sleep(0)
    finally:
        stop.set()
        await task
        await store.aclose()
        await reader.aclose()
    assert seen, "the reader never ran"
    assert all(snapshot in (old, new) for snapshot in seen)


async def test_bad_messages_raise_and_leave_the_list_untouched(key):
    store = RedisHistoryStore(REDIS_URL, key)
    try:
        await store.append(USER)
        with pytest.raises(TypeError, match="must be a dict"):
            await store.append(["not", "a", "dict"])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="not JSON-serialisable"):
            await store.replace([ASSISTANT, {"role": "user", "content": object()}])
        assert await store.load() == [USER]
    finally:
        await store.aclose()


async def test_malformed_elements_are_skipped_with_one_warning(key, raw, caplog):
    raw.rpush(key, json.dumps(USER), b"{torn", b"17", json.dumps(ASSISTANT))
    store = RedisHistoryStore(REDIS_URL, key)
    try:
        with caplog.at_level(logging.WARNING, logger="lattice_worker.history"):
            assert await store.load() == [USER, ASSISTANT]
    finally:
        await store.aclose()
    warnings = [r.getMessage() for r in caplog.records if r.name == "lattice_worker.history"]
    assert len(warnings) == 1
    assert key in warnings[0] and "1, 2" in warnings[0]


async def test_ttl_is_set_on_every_write(key, raw):
    store = RedisHistoryStore(REDIS_URL, key, ttl_seconds=300)
    try:
        await store.append(USER)
        assert 0 < raw.pttl(key) <= 300_000
        raw.persist(key)
        await store.replace([USER, ASSISTANT])
        assert 0 < raw.pttl(key) <= 300_000
    finally:
        await store.aclose()


def test_one_store_works_across_event_loops(key):
    """Successive asyncio.run() calls (like successive Celery tasks) each get
    their own client; a shared client would fail with "attached to a different loop"."""
    store = RedisHistoryStore(REDIS_URL, key)

    async def step(message: dict) -> list[dict]:
        await store.append(message)
        return await store.load()

    assert asyncio.run(step(USER)) == [USER]
    assert asyncio.run(step(ASSISTANT)) == [USER, ASSISTANT]
    assert asyncio.run(step(USER)) == [USER, ASSISTANT, USER]
    # clients of loops that have closed are dropped, not accumulated
    assert len(store._per_loop) == 1

    async def close() -> None:
        await store.aclose()

    asyncio.run(close())


def test_a_client_factory_is_called_once_per_event_loop(key):
    made: list[aioredis.Redis] = []

    def factory() -> aioredis.Redis:
        client = aioredis.from_url(REDIS_URL, decode_responses=True)  # decoding must not matter
        made.append(client)
        return client

    store = RedisHistoryStore(factory, key)

    async def step() -> list[dict]:
        await store.append(USER)
        loaded = await store.load()
        await store.aclose()
        return loaded

    assert asyncio.run(step()) == [USER]
    assert asyncio.run(step()) == [USER, USER]
    assert len(made) == 2


async def test_a_client_instance_is_used_as_given_and_not_closed(key):
    client = aioredis.from_url(REDIS_URL)
    try:
        store = RedisHistoryStore(client, key)
        await store.append(USER)
        await store.aclose()
        assert await client.llen(key) == 1  # still usable: the caller owns it
    finally:
        await client.aclose()


def test_bad_configuration_is_a_config_error():
    with pytest.raises(ConfigError, match="key must be a non-empty string"):
        RedisHistoryStore(REDIS_URL, "")
    with pytest.raises(ConfigError, match="expected a redis:// URL"):
        RedisHistoryStore(42, "k")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ttl_seconds"):
        RedisHistoryStore(REDIS_URL, "k", ttl_seconds=0)
