"""Fixtures shared by the integration tests: the team tests' mailboxes (``mailbox``,
``small_mailbox``), for the Redis-backed tests ``prefix`` and ``raw``, and the fake
Messages API server (``server``: one per test module, cleared for each test).

``mailbox`` and ``small_mailbox`` run a test once on a ``MemoryMailbox`` and once
on a ``RedisMailbox`` (real Redis at ``LATTICE_TEST_REDIS_URL``, default
127.0.0.1:6379/0; that case is marked ``redis``). Each Redis store gets a unique
key prefix, and its keys are deleted afterwards (never FLUSHDB: the server is shared).
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from lattice_mailbox import MemoryMailbox
from tests.support.fake_anthropic import FakeAnthropicServer

REDIS_URL = os.environ.get("LATTICE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
STORES = [pytest.param("memory", id="memory"), pytest.param("redis", id="redis", marks=pytest.mark.redis)]


@contextlib.asynccontextmanager
async def _store(kind: str, **options: Any) -> AsyncIterator[Any]:
    """A fresh store of ``kind`` (``"memory"`` or ``"redis"``); ``options`` go to its constructor."""
    if kind == "memory":
        yield MemoryMailbox(**options)
        return
    from lattice_mailbox.redis import RedisMailbox

    prefix = f"test-{uuid.uuid4().hex}"
    store = RedisMailbox(REDIS_URL, prefix=prefix, **options)
    try:
        yield store
    finally:
        client = store.client()
        keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
        await store.aclose()


@pytest.fixture(params=STORES)
async def mailbox(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """An empty store: memory, then Redis."""
    async with _store(request.param) as store:
        yield store


@pytest.fixture(params=STORES)
async def small_mailbox(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """A store that refuses messages over 10 000 bytes."""
    async with _store(request.param, max_message_bytes=10_000) as store:
        yield store


@pytest.fixture
def prefix():
    """A unique Redis key prefix for one test (``test-<12 hex>``); its keys are deleted afterwards."""
    import redis

    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(sync.scan_iter(match=f"{name}:*", count=1000))
        if keys:
            sync.delete(*keys)
    finally:
        sync.close()


@pytest.fixture
def raw():
    """A synchronous Redis client (decoded responses) for inspecting raw keys."""
    import redis

    sync = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield sync
    sync.close()


@pytest.fixture
async def ctx(prefix: str) -> AsyncIterator[Any]:
    """A :func:`tests.support.workers.worker_context` for one test; its run store is closed afterwards."""
    from tests.support.workers import worker_context

    context = worker_context(prefix)
    yield context
    await context.runs.aclose()


@pytest.fixture(scope="module")
def shared_server() -> Iterator[FakeAnthropicServer]:
    """One fake Messages API server per test module (starting one takes a moment)."""
    with FakeAnthropicServer() as srv:
        yield srv


@pytest.fixture
def server(shared_server: FakeAnthropicServer) -> FakeAnthropicServer:
    """The module's fake server with no recorded requests, no queued replies and no responder."""
    shared_server.clear()
    shared_server.responder = None
    return shared_server
