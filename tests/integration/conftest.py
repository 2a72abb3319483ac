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
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from lattice_mailbox import MemoryMailbox
from tests.support.fake_anthropic import FakeAnthropicServer
from tests.support.services import REDIS_URL

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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A module that sets ``STATE_STORES = ("redis", "cluster")`` runs each of its
    tests that use ``state_url`` once per store (``cluster``: the session's Redis Cluster)."""
    stores = getattr(metafunc.module, "STATE_STORES", None)
    if stores and "state_url" in metafunc.fixturenames:
        marks = {"cluster": [pytest.mark.cluster]}
        metafunc.parametrize(
            "state_url", [pytest.param(s, id=s, marks=marks.get(s, [])) for s in stores], indirect=True
        )


@pytest.fixture
def state_url(request: pytest.FixtureRequest) -> str:
    """The Redis URL of the test's runs and registry: the tests' Redis, or (in a
    module with ``STATE_STORES``, see :func:`pytest_generate_tests`) the session's
    Redis Cluster (``redis+cluster://...``)."""
    if getattr(request, "param", "redis") == "cluster":
        return str(request.getfixturevalue("redis_cluster").url)
    return REDIS_URL


def _state_client(url: str, **kwargs: Any) -> Any:
    """A blocking client of ``url`` (a cluster client for a cluster URL)."""
    import redis

    from lattice_mailbox.connections import is_cluster_url, sync_redis

    return sync_redis(url, **kwargs) if is_cluster_url(url) else redis.Redis.from_url(url, **kwargs)


@pytest.fixture
def prefix(state_url: str):
    """A unique Redis key prefix for one test (``test-<12 hex>``); its keys are deleted afterwards."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    sync = _state_client(state_url)
    try:
        keys = list(sync.scan_iter(match=f"{name}:*", count=1000))
        if keys and state_url == REDIS_URL:
            sync.delete(*keys)
        for key in keys if state_url != REDIS_URL else []:
            sync.delete(key)  # one DEL per key: on a cluster they lie in many slots
    finally:
        sync.close()


@pytest.fixture
def raw(state_url: str):
    """A synchronous Redis client (decoded responses) for inspecting raw keys (of ``state_url``)."""
    sync = _state_client(state_url, decode_responses=True)
    yield sync
    sync.close()


@pytest.fixture
async def store(prefix: str, state_url: str) -> AsyncIterator[Any]:
    """A ``RunStore`` on ``state_url`` under the test's ``prefix``, closed afterwards (the run-store tests').

    A test module with a ``store`` of its own (a mailbox's, say) overrides this one.
    """
    from lattice_client.runstore import RunStore

    s = RunStore(state_url, prefix=prefix)
    yield s
    await s.aclose()


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
