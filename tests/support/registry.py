"""Publish a live-registry entry as a running worker would (for tests without a worker process)."""

from __future__ import annotations

from typing import Any

import redis

from lattice_client.registry import WorkerInfo, now_ms, publish_blocking
from tests.support.services import REDIS_URL


def publish_fake_worker(
    prefix: str,
    teams: dict[str, str],
    *,
    node: str = "fake-worker@test",
    queues: list[str] | None = None,
    mailboxes: tuple[str, ...] | list[str] = (),
    ttl_seconds: float = 120.0,
    client: Any = None,
) -> WorkerInfo:
    """Write the registry entry of a worker ``node`` serving ``teams``
    (``{ref or name -> team name}``, member ``mailboxes``) under ``prefix``, expiring after ``ttl_seconds``."""
    info = WorkerInfo(
        node=node,
        teams=teams,
        mailboxes=list(mailboxes),
        queues=queues if queues is not None else sorted({f"{prefix}.{n}.lead" for n in teams.values()}),
        pool="threads",
        concurrency=1,
        heartbeat_seconds=ttl_seconds / 3,
        started_at_ms=now_ms(),
        seen_at_ms=now_ms(),
    )
    own = client is None
    client = client or redis.Redis.from_url(REDIS_URL)
    try:
        publish_blocking(client, prefix, info, ttl_seconds)
    finally:
        if own:
            client.close()
    return info
