"""The worker's heartbeat in the live registry (:mod:`lattice_client.registry`).

Started from Celery's ``worker_ready`` signal in the main worker process (as
the reaper is): :meth:`Heartbeat.start` writes the worker's entry once before
it returns -- so the registry knows the worker before Celery logs ``ready.``
-- and a daemon thread refreshes it every ``interval_s`` seconds with an
expiry of three intervals. A write that fails (Redis down, restarted,
unreachable) is logged, one line per attempt, and tried again at the next
beat: after a Redis restart the entry is back within one heartbeat.
:meth:`Heartbeat.stop` (``worker_shutdown``) deletes the entry.

The heartbeat uses its own blocking redis-py client (a thread, no event loop).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any

import redis

from lattice_client.registry import (
    WorkerInfo,
    heartbeat_ttl_seconds,
    now_ms,
    publish_blocking,
    unpublish_blocking,
)
from lattice_mailbox.connections import sync_redis

logger = logging.getLogger("lattice_worker.heartbeat")

_POOLS = {
    "celery.concurrency.prefork": "prefork",
    "lattice_worker.runtime.worker.aio_pool": "asyncio",
    "celery.concurrency.thread": "threads",
    "celery.concurrency.solo": "solo",
    "celery.concurrency.eventlet": "eventlet",
    "celery.concurrency.gevent": "gevent",
}


def pool_name(pool: Any) -> str:
    """Celery's name of a pool object or class (``threads``, ``prefork``, ...)."""
    cls = pool if isinstance(pool, type) else type(pool)
    return _POOLS.get(cls.__module__, cls.__name__)


def worker_info(
    node: str,
    teams: dict[str, str],
    queues: Iterable[str],
    pool: str,
    concurrency: int,
    interval_s: float,
    mailboxes: Iterable[str] = (),
) -> WorkerInfo:
    """The entry a worker publishes (see :class:`~lattice_client.registry.WorkerInfo`)."""
    now = now_ms()
    return WorkerInfo(
        node=node,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        teams=dict(teams),
        mailboxes=sorted(mailboxes),
        queues=sorted(queues),
        pool=pool,
        concurrency=concurrency,
        heartbeat_seconds=interval_s,
        started_at_ms=now,
        seen_at_ms=now,
    )


class Heartbeat:
    """Keeps one worker's registry entry alive (see the module doc).

    Args:
        info: what to publish (``seen_at_ms`` is refreshed at every beat).
        broker_url: the Redis URL of the registry (``settings.state_url``).
        prefix: the key prefix.
        interval_s: seconds between two beats (the entry expires after three).
        client_factory: builds the blocking Redis client (tests); default
            ``lattice_mailbox.connections.sync_redis(broker_url)`` with a 2 s socket timeout.
    """

    def __init__(
        self,
        info: WorkerInfo,
        broker_url: str,
        prefix: str,
        interval_s: float,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"heartbeat interval must be > 0 seconds, got {interval_s!r}")
        self.info = info
        self.prefix = prefix
        self.interval_s = interval_s
        timeout = max(0.5, min(2.0, interval_s))
        self._client = (client_factory or (lambda: _client(broker_url, timeout)))()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.beats = 0

    def beat(self) -> bool:
        """Write the entry now; ``True`` when it was written (failures are logged)."""
        self.info.seen_at_ms = now_ms()
        try:
            publish_blocking(self._client, self.prefix, self.info, heartbeat_ttl_seconds(self.interval_s))
        except redis.RedisError as exc:
            logger.warning("registry heartbeat of %s failed (retrying every %.1f s): %s",
                           self.info.node, self.interval_s, exc)  # fmt: skip
            self._failing = True
            return False
        if self._failing:
            logger.info("registry heartbeat of %s written again", self.info.node)
            self._failing = False
        self.beats += 1
        return True

    def start(self) -> None:
        """Beat once now, then every ``interval_s`` in a daemon thread."""
        if self._thread is not None:
            return
        self.beat()
        self._thread = threading.Thread(target=self._main, name="lattice-heartbeat", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def stop(self) -> None:
        """Stop beating and delete the entry (best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            unpublish_blocking(self._client, self.prefix, self.info.node)
        except redis.RedisError as exc:
            logger.info("could not remove the registry entry of %s: %s", self.info.node, exc)
        finally:
            self._client.close()


def _client(broker_url: str, timeout: float) -> redis.Redis:
    return sync_redis(broker_url, socket_timeout=timeout, socket_connect_timeout=timeout)


__all__ = ["Heartbeat", "pool_name", "worker_info"]
