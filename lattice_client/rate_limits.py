"""The model calls waiting for their turn under the shared rate limits (``LATTICE_MODEL_LIMITS``).

Read for ``lattice status`` (:class:`~lattice_client.views.StatusReport` ``rate_limited``)
from the keys the workers' buckets keep (``lattice_worker.runtime.limits.bucket``)::

    <prefix>:ratelimit:index                          set of "<model>|<key id>" seen
    <prefix>:ratelimit:{<model>|<key id>}:waiting     zset: ticket -> ms (Redis clock) its turn comes
    <prefix>:ratelimit:{<model>|<key id>}:bucket      hash; field "waiting:limit": the limit that made
                                                      the latest waiting call wait

API keys are named by their id (``sha256:<16 hex digits>``), never in clear.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class WaitingModelCalls(BaseModel):
    """The calls of one (model, API key) waiting for their turn now: how many
    (``waiting``), the longest wait left in **seconds** (``longest_seconds``)
    and the limit that made them wait (``limit``: ``"requests_per_minute"``,
    ``"input_tokens_per_minute"`` or ``"output_tokens_per_minute"``; ``None``
    when not recorded)."""

    model: str
    key_id: str
    waiting: int
    longest_seconds: float
    limit: str | None = None


def index_key(prefix: str) -> str:
    """``<prefix>:ratelimit:index``: the set of bucket tags seen."""
    return f"{prefix}:ratelimit:index"


def tag_keys(prefix: str, tag: str) -> tuple[str, str]:
    """``(bucket, waiting)`` keys of the bucket tag ``tag`` (``<model>|<key id>``)."""
    base = f"{prefix}:ratelimit:{{{tag}}}"
    return f"{base}:bucket", f"{base}:waiting"


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


async def waiting_calls(client: Any, prefix: str) -> list[WaitingModelCalls]:
    """The calls waiting for their turn now, per (model, key) seen, sorted by
    model then key (``client``: a ``redis.asyncio`` client). Entries with no
    call waiting are left out. Raises ``redis.RedisError`` when Redis fails."""
    tags = sorted(_text(t) for t in await client.smembers(index_key(prefix)))
    if not tags:
        return []
    now_s, now_us = await client.time()
    now = int(now_s) * 1000 + int(now_us) // 1000
    async with client.pipeline(transaction=False) as pipe:
        for tag in tags:
            bucket, waiting = tag_keys(prefix, tag)
            pipe.zrangebyscore(waiting, now, "+inf", withscores=True)
            pipe.hget(bucket, "waiting:limit")
        replies = await pipe.execute()
    out = []
    for i, tag in enumerate(tags):
        entries, limit = replies[2 * i], replies[2 * i + 1]
        if entries:
            model, _, key_id = tag.rpartition("|")
            longest = max(score for _m, score in entries) - now
            out.append(
                WaitingModelCalls(
                    model=model,
                    key_id=key_id,
                    waiting=len(entries),
                    longest_seconds=round(longest / 1000, 3),
                    limit=_text(limit) if limit else None,
                )
            )
    return out


__all__ = ["WaitingModelCalls", "index_key", "tag_keys", "waiting_calls"]
