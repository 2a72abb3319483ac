"""The live registry's entries against the real Redis: the heartbeat writes, refreshes and removes them."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from lattice_client.registry import LiveRegistry, read_workers_blocking, worker_key, workers_key
from lattice_worker.runtime.worker.heartbeat import Heartbeat, pool_name, worker_info
from tests.e2e.conftest import free_port
from tests.support.registry import publish_fake_worker

STATE_STORES = ("redis", "cluster")
"""Every test that takes a state store (``prefix``, ``raw``) runs on the tests' Redis and on the
session's Redis Cluster (tests/integration/conftest.py)."""

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def test_a_heartbeat_keeps_an_expiring_entry_and_removes_it_on_stop(prefix, raw, state_url):
    info = worker_info("w1@host", {"pkg.mod:team": "t", "t": "t"}, [f"{prefix}.t.lead"], "threads", 200, 0.2)
    beat = Heartbeat(info, state_url, prefix, 0.2)
    beat.start()
    try:
        ttl_ms = raw.pttl(worker_key(prefix, "w1@host"))
        assert 0 < ttl_ms <= 600  # three heartbeats
        time.sleep(0.7)  # past the first entry's expiry: refreshed meanwhile
        assert beat.beats >= 3
        [live] = read_workers_blocking(raw, prefix)
        assert (live.node, live.pool, live.concurrency, live.queues) == (
            "w1@host",
            "threads",
            200,
            [f"{prefix}.t.lead"],
        )
        assert LiveRegistry([live]).resolve("pkg.mod:team") == "t"
    finally:
        beat.stop()
    assert not raw.exists(worker_key(prefix, "w1@host"))
    assert raw.smembers(workers_key(prefix)) == set()


def test_a_failing_heartbeat_logs_one_line_per_attempt_and_keeps_going(caplog):
    # once, not on each state store: the heartbeat's Redis is a dead plain server either
    # way, and each attempt waits out the connect retries (about 3 s)
    dead = f"redis://127.0.0.1:{free_port()}/0"
    info = worker_info("w2@host", {"t": "t"}, [], "threads", 1, 0.1)
    beat = Heartbeat(info, dead, f"test-{uuid.uuid4().hex[:12]}", 0.1)
    with caplog.at_level(logging.WARNING, logger="lattice_worker.heartbeat"):
        assert beat.beat() is False
        assert beat.beat() is False
    lines = [r for r in caplog.records if "registry heartbeat of w2@host failed" in r.getMessage()]
    assert len(lines) == 2
    beat.stop()  # nothing to remove, no error


def test_readers_drop_expired_entries_from_the_index(prefix, raw):
    publish_fake_worker(prefix, {"a": "a"}, node="gone@test", ttl_seconds=0.1, client=raw)
    publish_fake_worker(prefix, {"b": "b"}, node="alive@test", client=raw)
    time.sleep(0.25)
    assert [w.node for w in read_workers_blocking(raw, prefix)] == ["alive@test"]
    assert raw.smembers(workers_key(prefix)) == {"alive@test"}


def test_pool_names():
    from celery.concurrency.prefork import TaskPool as Prefork
    from celery.concurrency.thread import TaskPool as Threads

    from lattice_worker.runtime.worker.aio_pool import AsyncioPool

    assert (pool_name(Threads), pool_name(Prefork)) == ("threads", "prefork")
    assert pool_name(AsyncioPool) == pool_name(AsyncioPool(limit=1)) == "asyncio"
