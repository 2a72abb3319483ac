"""The Celery configuration against the real Redis: key-prefix isolation with a real worker.

A real Celery worker (``celery.contrib.testing.worker.start_worker``, solo pool,
in a thread) consumes a queue of deployment A. While it runs, a raw Redis
``PSUBSCRIBE`` records every Pub/Sub channel mentioning the test's token
(remote-control broadcasts and task events travel over Pub/Sub), and afterwards
every key mentioning the token is listed: all of them must start with the
deployment's ``"<prefix>:"``. Deployment B (another prefix, same Redis) neither
reaches A's worker by remote control nor gets its tasks consumed.
"""

from __future__ import annotations

import json
import pickle
import threading
import uuid

import pytest
import redis
from celery.contrib.testing.worker import start_worker
from kombu.exceptions import ContentDisallowed
from kombu.serialization import loads, prepare_accept_content

from lattice_client.celery_config import make_celery_app, queue_name
from lattice_client.settings import get_settings
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(90)]


@pytest.fixture
def token():
    tok = uuid.uuid4().hex[:10]
    yield tok
    sync = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(sync.scan_iter(match=f"*{tok}*", count=1000))
        if keys:
            sync.delete(*keys)
    finally:
        sync.close()


class ChannelRecorder:
    """Records the names of Pub/Sub channels matching a pattern, in a thread."""

    def __init__(self, pattern: str) -> None:
        self.client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        self.pubsub = self.client.pubsub()
        self.pubsub.psubscribe(pattern)
        self.channels: set[str] = set()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.pubsub.get_message(timeout=0.1)
            if message and message["type"] == "pmessage":
                self.channels.add(message["channel"])

    def stop(self) -> set[str]:
        self._stop.set()
        self.thread.join(5)
        self.pubsub.close()
        self.client.close()
        return self.channels


def test_two_deployments_on_one_redis_never_meet(token):
    prefix_a, prefix_b = f"test-{token}-a", f"test-{token}-b"
    app_a = make_celery_app(settings_for(prefix_a))
    app_b = make_celery_app(settings_for(prefix_b))
    queue = queue_name(prefix_a, "team", "lead")
    seen_key = f"{prefix_a}:seen"

    @app_a.task(name="lattice.test_noop", shared=False)
    def noop(tag: str) -> None:
        sync = redis.Redis.from_url(REDIS_URL)
        try:
            sync.rpush(seen_key, tag)
        finally:
            sync.close()

    recorder = ChannelRecorder(f"*{token}*")
    raw = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with start_worker(
            app_a,
            pool="solo",
            perform_ping_check=False,
            queues=[queue],
            loglevel="WARNING",
            shutdown_timeout=20,
        ) as worker:
            replies_a = app_a.control.inspect(timeout=2).ping() or {}
            replies_b = app_b.control.inspect(timeout=1).ping()
            # B addresses the same queue *name*; under its own prefix nobody consumes it
            app_b.send_task("lattice.test_noop", args=["from-b"], queue=queue)
            app_a.send_task("lattice.test_noop", args=["from-a"], queue=queue)
            assert raw.blpop([seen_key], timeout=20) == (seen_key, "from-a")
            keys_while_running = set(raw.scan_iter(match=f"*{token}*", count=1000))
        assert worker.hostname in replies_a
        assert replies_a[worker.hostname] == {"ok": "pong"}
        assert not replies_b  # B's broadcast never reached A's worker
        assert raw.llen(f"{prefix_b}:{queue}") == 1  # B's task still waits under B's prefix
        assert raw.lrange(seen_key, 0, -1) == []  # A ran only its own task (popped above)
    finally:
        channels = recorder.stop()
        raw.close()
    keys = keys_while_running | set(redis.Redis.from_url(REDIS_URL, decode_responses=True).keys(f"*{token}*"))
    # task events and remote control went over Pub/Sub, every channel under a prefix
    assert any("celeryev" in c for c in channels), channels
    assert any("pidbox" in c for c in channels), channels
    assert all(c.startswith((f"{prefix_a}:", f"{prefix_b}:")) for c in channels), channels
    assert all(k.startswith((f"{prefix_a}:", f"{prefix_b}:")) for k in keys), keys
    assert any(k.startswith(f"{prefix_a}:_kombu.binding.") for k in keys), keys


def test_pickle_messages_are_refused_by_the_configured_app():
    """The worker decodes with ``accept_content``: pickle is refused, JSON accepted."""
    app = make_celery_app(settings_for("test-pickle"))
    accept = prepare_accept_content(app.conf.accept_content)
    pickled = pickle.dumps([1, 2])
    with pytest.raises(ContentDisallowed):
        loads(pickled, "application/x-python-serialize", "binary", accept=accept)
    assert loads(json.dumps([1, 2]), "application/json", "utf-8", accept=accept) == [1, 2]


def test_broker_connections_follow_the_connection_policy():
    # kombu hands the transport options to redis-py: health checks, keepalive, no resend on
    # a timeout; a broker blip lets running tasks finish (docs/contracts.md, "Connections")
    app = make_celery_app(get_settings(broker_url=REDIS_URL, key_prefix=f"test-{uuid.uuid4().hex[:8]}"))
    assert app.conf.worker_cancel_long_running_tasks_on_connection_loss is False
    assert app.conf.broker_connection_retry is True
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        kwargs = channel.client.connection_pool.connection_kwargs
        assert kwargs["health_check_interval"] == 10
        assert kwargs["socket_keepalive"] is True and kwargs["socket_keepalive_options"]
        assert not kwargs.get("retry_on_timeout")
        assert kwargs["socket_timeout"] == 10  # a silent broker fails a publish, never hangs the loop
        assert channel.client.ping()
