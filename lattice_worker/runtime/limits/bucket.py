"""Token buckets per (model, API key) in Redis, shared by every worker.

:class:`RateLimiter` runs one Lua script per operation (``lua/take.lua``,
``lua/settle.lua``, ``lua/feed.lua``; their headers list KEYS, ARGV and
returns). A call **reserves** its share first (one request, its estimated
input tokens); the buckets may go into debt, and the debt is the queue: the
reservation says how long to wait for its turn, and later calls get later
turns (FIFO, nothing races). After the call the reservation is **settled**
with the response's usage; what the provider says (``anthropic-ratelimit-*``
headers, a 429's ``retry-after``) is **fed** to the same buckets, so every
worker slows down.

Keys (``<prefix>`` honoured, one hash slot per (model, key))::

    <prefix>:ratelimit:{<model>|<key id>}:bucket    hash of the three buckets' levels
    <prefix>:ratelimit:{<model>|<key id>}:waiting   zset: tickets of the calls waiting -> ms their turn comes
    <prefix>:ratelimit:index                        set of "<model>|<key id>" seen (for lattice status)

The API key is named by :func:`~lattice_client.model_limits.api_key_id`, never in clear.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from lattice_client.model_limits import DIMENSIONS, ModelLimit, api_key_id, limit_for
from lattice_client.rate_limits import index_key
from lattice_client.rate_limits import waiting_calls as read_waiting_calls

_LUA = resources.files("lattice_worker.runtime.limits").joinpath("lua")
TAKE_LUA = _LUA.joinpath("take.lua").read_text(encoding="utf-8")
"""Reserve a call's share (see the module doc)."""
SETTLE_LUA = _LUA.joinpath("settle.lua").read_text(encoding="utf-8")
"""Correct a reservation with the call's usage."""
FEED_LUA = _LUA.joinpath("feed.lua").read_text(encoding="utf-8")
"""Lower the buckets to what the provider said."""

LIMIT_NAMES = {1: "requests_per_minute", 2: "input_tokens_per_minute", 3: "output_tokens_per_minute"}
"""The limit a ``take.lua`` dimension number stands for."""


def bucket_tag(model: str, key_id: str) -> str:
    """``<model>|<key id>``, the hash tag of a bucket (a model name holding a brace is hashed)."""
    if "{" in model or "}" in model:
        model = "model-" + hashlib.sha256(model.encode("utf-8")).hexdigest()[:16]
    return f"{model}|{key_id}"


@dataclass(frozen=True)
class LimitKeys:
    """The Redis keys of one (model, key)'s buckets."""

    bucket: str
    waiting: str

    @classmethod
    def of(cls, prefix: str, tag: str) -> LimitKeys:
        base = f"{prefix}:ratelimit:{{{tag}}}"
        return cls(bucket=f"{base}:bucket", waiting=f"{base}:waiting")


@dataclass(frozen=True)
class Reservation:
    """A call's place in the buckets of ``model`` for API key ``key_id``.

    ``wait_seconds`` (float, >= 0): how long after ``reserved_at_ms`` (server
    clock) its turn comes; ``limit``: the limit that made it wait
    (``"requests_per_minute"`` ...; ``None`` when it did not wait);
    ``amounts``: ``(requests, input tokens, output tokens)`` taken; ``shift_ms``:
    the key's shift when it was taken (a later 429 moves the turn by what the
    shift grew since, ``feed.lua``)."""

    model: str
    key_id: str
    ticket: str
    wait_seconds: float
    limit: str | None
    amounts: tuple[int, int, int]
    reserved_at_ms: int
    shift_ms: int = 0


class RateLimiter:
    """The shared buckets of a deployment (see the module doc).

    Args:
        redis: returns the ``redis.asyncio`` client of the running loop.
        prefix: the key prefix (``LatticeSettings.key_prefix``).
        limits: ``LatticeSettings.model_limits`` (model or ``"*"`` -> limits).
    """

    def __init__(
        self, redis: Callable[[], Awaitable[Any]], prefix: str, limits: dict[str, ModelLimit]
    ) -> None:
        self._redis = redis
        self.prefix = prefix
        self.limits = dict(limits)
        self._indexed: set[str] = set()

    def limit_of(self, model: str, api_key: str | None) -> ModelLimit | None:
        """The limit that applies to ``model`` with ``api_key`` (``None``: not limited)."""
        entry = limit_for(self.limits, model)
        return entry.for_key(api_key_id(api_key)) if entry is not None else None

    def _args(self, limit: ModelLimit) -> list[Any]:
        return [int(limit.period_seconds * 1000), *limit.capacities()]

    def _keys(self, model: str, key_id: str) -> tuple[str, LimitKeys]:
        tag = bucket_tag(model, key_id)
        return tag, LimitKeys.of(self.prefix, tag)

    async def reserve(
        self, model: str, api_key: str | None, input_tokens: int, output_tokens: int = 0
    ) -> Reservation | None:
        """Take one request and ``input_tokens`` (and ``output_tokens``) from the
        buckets of ``model`` for ``api_key``; ``None`` when no limit applies.
        Raises ``redis.RedisError`` when Redis fails."""
        limit = self.limit_of(model, api_key)
        if limit is None:
            return None
        key_id = api_key_id(api_key)
        tag, keys = self._keys(model, key_id)
        client = await self._redis()
        if tag not in self._indexed:
            await client.sadd(index_key(self.prefix), tag)
            self._indexed.add(tag)
        ticket = uuid.uuid4().hex
        amounts = (1, max(0, int(input_tokens)), max(0, int(output_tokens)))
        wait_ms, dim, now, shift = await client.eval(
            TAKE_LUA, 2, keys.bucket, keys.waiting, *self._args(limit), *amounts, ticket
        )
        return Reservation(
            model=model,
            key_id=key_id,
            ticket=ticket,
            wait_seconds=int(wait_ms) / 1000.0,
            limit=LIMIT_NAMES.get(int(dim)) if int(wait_ms) > 0 else None,
            amounts=amounts,
            reserved_at_ms=int(now),
            shift_ms=int(shift),
        )

    async def settle(
        self,
        reservation: Reservation,
        input_tokens: int | None,
        output_tokens: int | None,
        *,
        used: bool = True,
    ) -> list[str]:
        """Correct ``reservation`` with the call's usage (``None``: as estimated).
        ``used=False`` gives the whole reservation back (the call never reached
        the provider). Returns the buckets' levels (strings, ``""`` where not limited)."""
        limit = self._limit_by_id(reservation)
        if limit is None:
            return ["", "", ""]
        if used:
            deltas = (
                0,
                0 if input_tokens is None else int(input_tokens) - reservation.amounts[1],
                0 if output_tokens is None else int(output_tokens) - reservation.amounts[2],
            )
        else:
            deltas = tuple(-a for a in reservation.amounts)
        _tag, keys = self._keys(reservation.model, reservation.key_id)
        client = await self._redis()
        return list(
            await client.eval(
                SETTLE_LUA, 2, keys.bucket, keys.waiting, *self._args(limit), *deltas, reservation.ticket
            )
        )

    def _limit_by_id(self, reservation: Reservation) -> ModelLimit | None:
        entry = limit_for(self.limits, reservation.model)
        return entry.for_key(reservation.key_id) if entry is not None else None

    async def feed(
        self,
        model: str,
        api_key: str | None,
        remaining: dict[str, int] | None = None,
        blocked_seconds: float = 0.0,
    ) -> list[str] | None:
        """Lower the buckets of ``model`` for ``api_key`` to what the provider said:
        ``remaining`` (``{"requests": N, "input_tokens": N, "output_tokens": N}``,
        any subset) and ``blocked_seconds`` (a 429's ``retry-after``: no call starts
        before it passed). Returns the levels, or ``None`` when no limit applies."""
        limit = self.limit_of(model, api_key)
        if limit is None:
            return None
        remaining = remaining or {}
        told = ["" if remaining.get(d) is None else str(int(remaining[d])) for d in DIMENSIONS]
        _tag, keys = self._keys(model, api_key_id(api_key))
        client = await self._redis()
        block_ms = max(0, int(blocked_seconds * 1000))
        return list(await client.eval(FEED_LUA, 1, keys.bucket, *self._args(limit), *told, block_ms))


async def waiting_calls(client: Any, prefix: str) -> list[dict[str, Any]]:
    """``[{"model", "key_id", "waiting", "longest_seconds", "limit"}]``: the calls
    waiting for their turn now, per (model, key) seen
    (:func:`lattice_client.rate_limits.waiting_calls` as dicts)."""
    return [w.model_dump() for w in await read_waiting_calls(client, prefix)]


__all__ = [
    "FEED_LUA",
    "LIMIT_NAMES",
    "SETTLE_LUA",
    "TAKE_LUA",
    "LimitKeys",
    "RateLimiter",
    "Reservation",
    "bucket_tag",
    "index_key",
    "waiting_calls",
]


async def pipelined_time(client: Any, pipe: Any, key: str) -> Any:
    """Queue ``TIME`` on ``pipe`` (a pipeline of ``client``), or -- on a Redis
    Cluster, whose pipelines refuse ``TIME`` -- ask the node of ``key`` at once.
    Returns what to put first among the pipeline's replies: ``None`` when it
    was queued (it is then the pipeline's first reply), else ``(s, us)``."""
    if not hasattr(client, "get_node_from_key"):  # one Redis (redis.asyncio.Redis)
        pipe.time()
        return None
    return await client.time(target_nodes=client.get_node_from_key(key))


def with_time(queued: Any, replies: list[Any]) -> list[Any]:
    """The pipeline's ``replies`` with ``TIME``'s first (see :func:`pipelined_time`)."""
    return replies if queued is None else [queued, *replies]
