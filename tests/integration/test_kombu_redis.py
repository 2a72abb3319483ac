"""``lattice_client.kombu_redis``: kombu's Redis transport with one redis-py client per channel.

The first tests pin the kombu behaviour the transport relies on (a stock
channel builds a new ``redis.Redis`` for every blocking command, and its
publish and ack paths get their client from ``Channel._create_client``); the
others check that our channel reuses one client per connection pool, from
many threads at once, and that a Celery app of ``make_celery_app`` publishes
and consumes through it with the key prefix as before.
"""

from __future__ import annotations

import threading

import pytest
import redis
from kombu import Connection, Exchange, Queue
from kombu.transport import redis as kombu_redis

from lattice_client.celery_config import make_celery_app
from lattice_client.kombu_redis import ALIAS, TRANSPORT_PATH, Channel, Transport
from lattice_client.settings import get_settings
from tests.support.services import REDIS_URL, settings_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _connection(prefix: str, transport: object) -> Connection:
    return Connection(REDIS_URL, transport=transport, transport_options={"global_keyprefix": f"{prefix}:"})


def test_kombu_builds_a_client_per_blocking_command_and_publishes_through_it(prefix, monkeypatch):
    # the behaviour our channel changes: pinned so a kombu upgrade that stops doing it is noticed
    with _connection(prefix, "redis") as conn:
        channel = conn.default_channel
        assert type(channel) is kombu_redis.Channel
        assert channel._create_client() is not channel._create_client()
        built: list[object] = []
        original = kombu_redis.Channel._create_client

        def spy(self, asynchronous=False):
            client = original(self, asynchronous)
            if not asynchronous:
                built.append(client)
            return client

        monkeypatch.setattr(kombu_redis.Channel, "_create_client", spy)
        queue = Queue(f"{prefix}.q", Exchange(f"{prefix}.q"), routing_key=f"{prefix}.q")
        producer = conn.Producer()
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue])
        producer.publish({"n": 2}, exchange=queue.exchange, routing_key=queue.routing_key)
        assert len(built) >= 2  # a new client for each publish
        with channel.conn_or_acquire() as client:
            assert client is built[-1]


def test_our_channel_reuses_one_client_until_its_pool_changes(prefix):
    with _connection(prefix, TRANSPORT_PATH) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel) and isinstance(conn.transport, Transport)
        first = channel._create_client()
        assert channel._create_client() is first
        with channel.conn_or_acquire() as client:
            assert client is first
        assert first.connection_pool is channel.pool
        # the asynchronous (BRPOP) client is kombu's own, as before
        assert channel._create_client(asynchronous=True) is not first
        channel._pool = None  # kombu drops its pool on a reconnect: a new client follows it
        again = channel._create_client()
        assert again is not first and again.connection_pool is channel.pool


def test_publishes_from_many_threads_all_land_under_the_prefix(prefix):
    queue = Queue(f"{prefix}.q", Exchange(f"{prefix}.q"), routing_key=f"{prefix}.q")
    with _connection(prefix, TRANSPORT_PATH) as conn:
        conn.Producer().publish({}, exchange=queue.exchange, routing_key=queue.routing_key, declare=[queue])
        errors: list[BaseException] = []

        def publish(thread: int) -> None:
            try:
                with Connection(REDIS_URL, transport=TRANSPORT_PATH,
                                transport_options={"global_keyprefix": f"{prefix}:"}) as own:  # fmt: skip
                    producer = own.Producer()
                    for n in range(50):
                        producer.publish(
                            {"t": thread, "n": n}, exchange=queue.exchange, routing_key=queue.routing_key
                        )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        raw = redis.Redis.from_url(REDIS_URL)
        try:
            assert raw.llen(f"{prefix}:{prefix}.q") == 1 + 8 * 50
        finally:
            raw.close()
        received = []
        with conn.SimpleQueue(queue) as simple:
            for _ in range(1 + 8 * 50):
                message = simple.get(timeout=5)
                received.append(message.payload)
                message.ack()
        assert sorted((p["t"], p["n"]) for p in received if p) == [
            (t, n) for t in range(8) for n in range(50)
        ]


def test_a_celery_app_of_make_celery_app_sends_through_it(prefix):
    app = make_celery_app(settings_for(prefix))
    try:
        assert app.conf.broker_transport == ALIAS
        with app.connection_for_write() as conn:
            assert isinstance(conn.default_channel, Channel)
            assert conn.as_uri().startswith("redis://")  # shown as kombu's redis (Flower picks by it)
        app.send_task("lattice.deliver", args=["a::b"], queue=f"{prefix}.t.b")
        raw = redis.Redis.from_url(REDIS_URL)
        try:
            assert raw.llen(f"{prefix}:{prefix}.t.b") == 1
        finally:
            raw.close()
    finally:
        app.close()


def test_a_rediss_broker_keeps_kombus_transport_and_its_tls():
    # kombu turns TLS on only for a transport named "rediss": ours is for redis:// alone
    app = make_celery_app(get_settings(key_prefix="test-x", broker_url="rediss://:pw@127.0.0.1:6390/0"))
    try:
        assert app.conf.broker_transport is None
        conn = app.connection_for_write()
        assert conn.transport_cls == "rediss" and conn.ssl
        assert not isinstance(conn.transport, Transport)
    finally:
        app.close()
