"""kombu's Redis transport, with one redis-py client per channel instead of one per command.

kombu 5.7's Redis ``Channel`` builds a new ``redis.Redis`` object (on its
shared connection pool) for every publish, every task event, every ack and
every unacked-restore record (``Channel.conn_or_acquire`` ->
``Channel._create_client``). redis-py 8 fills a table of about 200 response
callbacks in each new client, which made client construction about a tenth of
a worker's CPU per step (measured in ``bench/distributed.py``; docs/deploy.md,
"Pools and sizing for model latency"). This transport keeps one client per channel and pool:
redis-py clients are thread-safe (each command takes a connection from the
pool; pipelines are separate objects), so nothing else changes -- same
connection pool, same key prefixing, same commands.

It is selected by ``broker_transport`` in
:func:`lattice_client.celery_config.celery_config` for ``redis://`` broker
URLs (``rediss://`` keeps kombu's own transport: kombu turns TLS on only for
a transport named ``rediss``), under the kombu transport alias :data:`ALIAS`,
registered when this module is imported in ``kombu.transport.TRANSPORT_ALIASES``
and, as shown, in kombu's ``resolve_aliases`` (as kombu shows ``pyamqp`` as
``amqp``): the broker still reads ``redis://...`` in Celery's banner, its logs
and Flower, which picks its broker page's client by that scheme. It relies on one kombu detail,
pinned by ``tests/integration/test_kombu_redis.py``: the blocking commands of a
channel get their client from ``Channel._create_client(asynchronous=False)``.
"""

from __future__ import annotations

import threading
from typing import Any

from kombu.connection import resolve_aliases
from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    """kombu's Redis channel, reusing one blocking client per connection pool."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lattice_client: Any = None
        self._lattice_client_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)
        client = self._lattice_client
        pool = self.pool
        if client is None or client.connection_pool is not pool:
            with self._lattice_client_lock:
                client = self._lattice_client
                if client is None or client.connection_pool is not pool:
                    client = self._lattice_client = super()._create_client(asynchronous=False)
        return client


class Transport(kombu_redis.Transport):
    """kombu's Redis transport with :class:`Channel`."""

    Channel = Channel


TRANSPORT_PATH = "lattice_client.kombu_redis:Transport"
"""The transport's ``module:Class`` path."""

ALIAS = "lattice-redis"
"""The transport's kombu alias (Celery's ``broker_transport``)."""

TRANSPORT_ALIASES.setdefault(ALIAS, TRANSPORT_PATH)
resolve_aliases.setdefault(ALIAS, "redis")

__all__ = ["ALIAS", "TRANSPORT_PATH", "Channel", "Transport"]
