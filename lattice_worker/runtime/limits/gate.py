"""The model calls of a step under the shared rate limits: :class:`LimitedModelClient`.

A worker step's agent gets its model client wrapped (``limits.hook.limited_client``).
Each call first takes its turn from the shared buckets
(:class:`~lattice_worker.runtime.limits.bucket.RateLimiter`):

* no wait, or a wait up to :data:`SHORT_WAIT_SECONDS`: the call sleeps and goes;
* a longer wait, in a step that may end (the running :class:`CallScope` says
  so): the reservation is **held** in Redis (key ``<prefix>:ratelimit:hold:<run id>:<scope>``,
  it keeps the call's place), the scope notes the :class:`TurnWait` and the call
  raises :class:`RateLimitWait` (a ``SuspendQuery``): the query ends
  ``suspended``, the step ends and is enqueued again for the turn
  (``limits.hook``). The next attempt of the same scope finds the held
  reservation and waits only for what is left of it, so nothing runs early
  and nothing loses its place;
* a step that may not end (no scope, or ``suspendable=False``) sleeps.

After the call its reservation is settled with the response's ``usage``, and
what the provider said is fed to the buckets: the ``anthropic-ratelimit-*-remaining``
headers, and for a 429 its ``retry-after`` (``retry-after-ms``), after which the
call takes a new turn (at most :data:`RATE_LIMIT_RETRIES` times). The Anthropic
client makes such calls without its SDK's own retries
(:class:`~lattice_worker.agent.response_observer.ResponseObserver` ``own_retries``):
408/409/5xx/529 and connection errors are retried here with the client's
``max_retries`` and a short backoff. The run's events say when a call waits
(``model_call_waiting``) and when the provider refused one (``model_rate_limited``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from lattice_client.model_limits import api_key_id

from ...agent.response_observer import ResponseObserver, current_observer
from ...agent.suspend import SuspendQuery
from ...errors import LatticeError
from ..run.estimate import estimate_input_tokens
from .bucket import LimitKeys, RateLimiter, Reservation, bucket_tag, pipelined_time, with_time

logger = logging.getLogger("lattice_worker.runtime.limits")

SHORT_WAIT_SECONDS = 1.0
"""A wait for a turn up to this many seconds is slept in the step; a longer one ends the step."""

RATE_LIMIT_RETRIES = 8
"""How many times a call the provider refused with a 429 takes a new turn before the 429 is its error."""

RETRY_STATUSES = frozenset({408, 409, 500, 502, 503, 504, 529})
"""Statuses retried with a backoff (as the SDK would) when the limiter makes the retries."""

REMAINING_HEADERS = {
    "requests": "anthropic-ratelimit-requests-remaining",
    "input_tokens": "anthropic-ratelimit-input-tokens-remaining",
    "output_tokens": "anthropic-ratelimit-output-tokens-remaining",
}
"""The response headers that lower the buckets (the provider's remaining counts)."""

RETRY_AFTER = "retry_after"
"""The "limit" a call waits for when the provider's 429 holds its key (its ``retry-after``)."""

DEFAULT_BLOCK_SECONDS = 1.0
"""How long a 429 without ``retry-after`` holds the calls of its key."""


@dataclass
class TurnWait:
    """A call that waits for its turn: ``seconds`` from now (float), the
    ``limit`` that made it wait (``"requests_per_minute"`` ...), the bucket's
    ``model`` and ``key_id``, and ``resume_at_ms`` (the Redis server's clock)."""

    seconds: float
    limit: str | None
    model: str
    key_id: str
    resume_at_ms: int


class RateLimitWait(SuspendQuery):  # noqa: N818 - a SuspendQuery, not an error
    """Raised by the model call whose turn is more than :data:`SHORT_WAIT_SECONDS`
    away in a step that may end; ``wait`` says how long and why."""

    def __init__(self, wait: TurnWait) -> None:
        super().__init__(f"model call waits {wait.seconds:.1f} s for its turn ({wait.limit})")
        self.wait = wait


@dataclass
class CallScope:
    """Where the model calls of a step run: ``run_id``, ``scope`` (``"lead"``, or
    ``"item:<work item id>"``), ``who`` (fields naming it in events: ``member``,
    ``work_item_id``), ``emit`` (an async callable taking a run event dict), and
    ``suspendable``: the step may end to wait. ``wait`` is set when a call made
    it end; ``on_wait`` is called with it first (a member's journal notes it),
    and with ``None`` when a later call of the step goes ahead after all (a
    compaction's summary request waited, then the turn came: the step goes on)."""

    run_id: str
    scope: str
    emit: Callable[[dict[str, Any]], Awaitable[Any]] | None
    suspendable: bool
    who: dict[str, Any] = field(default_factory=dict)
    on_wait: Callable[[TurnWait | None], None] | None = None
    wait: TurnWait | None = None


current_scope: ContextVar[CallScope | None] = ContextVar("lattice_call_scope", default=None)
"""The :class:`CallScope` of the step running in this context (``None``: calls only sleep)."""


def hold_key(prefix: str, run_id: str, scope: str) -> str:
    """``<prefix>:ratelimit:hold:<run id>:<scope>``: the reservation a waiting call keeps (JSON)."""
    return f"{prefix}:ratelimit:hold:{run_id}:{scope}"


def retry_after_seconds(headers: dict[str, str]) -> float | None:
    """``retry-after-ms`` / ``retry-after`` (seconds) of a response, or ``None``."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return max(0.0, float(value) / scale)
            except ValueError:  # an HTTP date: not used
                continue
    return None


def remaining_of(headers: dict[str, str]) -> dict[str, int]:
    """The provider's remaining counts in ``headers`` (see :data:`REMAINING_HEADERS`)."""
    out = {}
    for dim, name in REMAINING_HEADERS.items():
        value = headers.get(name)
        if value is not None:
            try:
                out[dim] = int(float(value))
            except ValueError:
                continue
    return out


class LimitedModelClient:
    """A model client whose calls take their turn from the shared buckets first
    (see the module doc). ``inner``: the agent's client (``None``: an
    ``AnthropicModelClient(api_key=, base_url=)``, made on first use).
    Raises what ``inner`` raises (a 429 after :data:`RATE_LIMIT_RETRIES` new
    turns), ``RateLimitWait`` when the step is to end, ``redis.RedisError``."""

    def __init__(
        self, inner: Any, limiter: RateLimiter, *, api_key: str | None = None, base_url: str | None = None
    ) -> None:
        self._inner = inner
        self.limiter = limiter
        self._api_key = api_key
        self._base_url = base_url

    @property
    def inner(self) -> Any:
        """The wrapped client."""
        if self._inner is None:
            from ...agent.anthropic_client import AnthropicModelClient

            self._inner = AnthropicModelClient(api_key=self._api_key, base_url=self._base_url)
        return self._inner

    def __getattr__(self, name: str) -> Any:  # api_key, default_model... of the wrapped client
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def create_message(self, request: Any) -> Any:
        inner = self.inner
        model = getattr(request, "model", None) or getattr(inner, "default_model", None) or _default_model()
        api_key = getattr(inner, "api_key", None) or self._api_key
        if self.limiter.limit_of(model, api_key) is None:
            return await inner.create_message(request)
        scope = current_scope.get()
        estimate = estimate_input_tokens(request)
        refused = 0
        failures = 0
        keep: Reservation | None = None
        held: CallScope | None = None  # the scope whose held reservation this call uses (dropped after it)
        while True:
            reservation, wait, from_hold = await self._turn(scope, model, api_key, estimate, keep)
            if keep is None:
                held = scope if from_hold else None
            keep = None
            if wait.seconds > 0:
                await self._waiting(scope, reservation, wait)
            if (
                scope is not None and scope.wait is not None
            ):  # an earlier call of the step waited; this one goes
                scope.wait = None
                if scope.on_wait is not None:
                    scope.on_wait(None)
            observer = ResponseObserver(own_retries=True)
            reset = current_observer.set(observer)
            try:
                message = await inner.create_message(request)
            except LatticeError as exc:
                status = getattr(exc, "status_code", None)
                heard = observer.last[1] if observer.last is not None else {}
                if status == 429 and refused < RATE_LIMIT_RETRIES:
                    refused += 1  # it keeps its reservation (its place) and goes after the retry-after
                    await self._refused(scope, reservation, api_key, heard)
                    keep = reservation
                    continue
                if _retryable(exc, status) and failures < _max_retries(inner):
                    failures += 1
                    await self.limiter.settle(reservation, None, None, used=status is not None)
                    await self._drop_hold(held)
                    await asyncio.sleep(min(8.0, 0.5 * 2 ** (failures - 1)))
                    continue
                await self._settled(held, reservation, None, api_key, used=status is not None, headers=heard)
                raise
            except BaseException:
                await asyncio.shield(self._settled(held, reservation, None, api_key, used=False, headers={}))
                raise
            finally:
                current_observer.reset(reset)
            heard = observer.last[1] if observer.last is not None else {}
            usage = getattr(message, "usage", None)
            await self._settled(held, reservation, usage, api_key, used=True, headers=heard)
            return message

    # -- the turn ------------------------------------------------------------------------------

    async def _turn(
        self,
        scope: CallScope | None,
        model: str,
        api_key: str | None,
        estimate: int,
        keep: Reservation | None,
    ) -> tuple[Reservation, TurnWait, bool]:
        """The call's reservation, how long it waits, and whether it is the one
        held for ``scope``: ``keep`` (a call the provider refused: its place is
        kept), the held one, or a new one; never before the key's
        ``blocked_until`` (a 429's retry-after)."""
        key_id = api_key_id(api_key)
        client = await self.limiter._redis()
        bucket = LimitKeys.of(self.limiter.prefix, bucket_tag(model, key_id)).bucket
        key = hold_key(self.limiter.prefix, scope.run_id, scope.scope) if scope is not None else None
        async with client.pipeline(transaction=False) as pipe:
            clock = await pipelined_time(client, pipe, bucket)  # the bucket's node's clock
            pipe.hmget(bucket, "blocked_until", "shift_ms")
            if key is not None and keep is None:
                pipe.get(key)
            replies = with_time(clock, await pipe.execute())
        now = int(replies[0][0]) * 1000 + int(replies[0][1]) // 1000
        blocked = int(float(replies[1][0])) if replies[1][0] else 0
        shift = int(float(replies[1][1])) if replies[1][1] else 0
        if keep is not None:
            keep = replace(keep, shift_ms=shift)  # its turn is now: after the block, not a later shift
            return keep, _wait_until(keep, model, key_id, max(blocked, now), now, RETRY_AFTER), False
        held = decode_hold(replies[2]) if key is not None else None
        if held is not None:
            reservation, resume_at, limit = held
            if reservation.model == model and reservation.key_id == key_id:
                if shift > reservation.shift_ms:  # a 429 since moved every turn handed out
                    resume_at, limit = resume_at + shift - reservation.shift_ms, RETRY_AFTER
                    reservation = replace(reservation, shift_ms=shift)  # held again: moved once
                if blocked > resume_at:
                    resume_at, limit = blocked, RETRY_AFTER
                wait = _wait_until(reservation, model, key_id, max(resume_at, now), now, limit)
                return reservation, wait, True
            await client.delete(key)  # another model or key now: that place is given up
            await self.limiter.settle(reservation, None, None, used=False)
        reservation = await self.limiter.reserve(model, api_key, estimate)
        assert reservation is not None  # limit_of said a limit applies
        now = reservation.reserved_at_ms
        resume_at, limit = now + int(round(reservation.wait_seconds * 1000)), reservation.limit
        if blocked > resume_at:
            resume_at, limit = blocked, RETRY_AFTER
        return reservation, _wait_until(reservation, model, key_id, resume_at, now, limit), False

    async def _waiting(self, scope: CallScope | None, reservation: Reservation, wait: TurnWait) -> None:
        ends = scope is not None and scope.suspendable and wait.seconds > SHORT_WAIT_SECONDS
        if scope is not None:
            if ends:  # the place is kept for the step's next attempt
                await self.hold(scope, reservation, wait)
            await self._emit(
                scope,
                {
                    "type": "model_call_waiting",
                    "model": wait.model,
                    "key_id": wait.key_id,
                    "limit": wait.limit,
                    "wait_seconds": round(wait.seconds, 3),
                    "resume_at_ms": wait.resume_at_ms,
                    "requeued": ends,
                },
            )
        if not ends:
            try:
                await asyncio.sleep(wait.seconds)
            except BaseException:  # aborted while waiting: the turn is given back
                await asyncio.shield(self.limiter.settle(reservation, None, None, used=False))
                raise
            return
        assert scope is not None
        scope.wait = wait
        if scope.on_wait is not None:
            scope.on_wait(wait)
        raise RateLimitWait(wait)

    async def hold(self, scope: CallScope, reservation: Reservation, wait: TurnWait) -> None:
        """Keep ``reservation`` for the next attempt of ``scope`` (until its turn and two periods past it)."""
        client = await self.limiter._redis()
        limit = self.limiter._limit_by_id(reservation)
        period_ms = int((limit.period_seconds if limit is not None else 60.0) * 1000)
        value = json.dumps(
            {"reservation": asdict(reservation), "resume_at_ms": wait.resume_at_ms, "limit": wait.limit}
        )
        ttl = max(1000, int(wait.seconds * 1000) + 2 * period_ms)
        waiting = LimitKeys.of(self.limiter.prefix, bucket_tag(reservation.model, reservation.key_id)).waiting
        async with client.pipeline(transaction=False) as pipe:
            pipe.set(hold_key(self.limiter.prefix, scope.run_id, scope.scope), value, px=ttl)
            pipe.zadd(waiting, {reservation.ticket: wait.resume_at_ms})  # listed (lattice status) until then
            await pipe.execute()

    async def _drop_hold(self, scope: CallScope | None) -> None:
        if scope is not None:
            client = await self.limiter._redis()
            await client.delete(hold_key(self.limiter.prefix, scope.run_id, scope.scope))

    # -- after the call ------------------------------------------------------------------------

    async def _settled(
        self,
        held: CallScope | None,
        reservation: Reservation,
        usage: Any,
        api_key: str | None,
        *,
        used: bool,
        headers: dict[str, str],
    ) -> None:
        # held: the scope whose held reservation the call used (dropped now), else None
        try:
            await self._drop_hold(held)
            input_tokens = output_tokens = None
            if usage is not None:
                input_tokens = int(getattr(usage, "input_tokens", 0) or 0) + int(
                    getattr(usage, "cache_creation_input_tokens", 0) or 0
                )
                output_tokens = int(getattr(usage, "output_tokens", 0) or 0)
            await self.limiter.settle(reservation, input_tokens, output_tokens, used=used)
            remaining = remaining_of(headers)
            if remaining:
                await self.limiter.feed(reservation.model, api_key, remaining)
        except Exception:  # the call's outcome stands; the buckets heal as they refill
            logger.warning("could not settle a model call's rate-limit reservation", exc_info=True)

    async def _refused(
        self, scope: CallScope | None, reservation: Reservation, api_key: str | None, headers: dict[str, str]
    ) -> None:
        block = retry_after_seconds(headers)
        block = DEFAULT_BLOCK_SECONDS if block is None else block
        await self.limiter.feed(reservation.model, api_key, remaining_of(headers), blocked_seconds=block)
        logger.info(
            "model %s: the provider refused a call (429); its key waits %.1f s", reservation.model, block
        )
        if scope is not None:
            await self._emit(
                scope,
                {
                    "type": "model_rate_limited",
                    "model": reservation.model,
                    "key_id": reservation.key_id,
                    "status": 429,
                    "retry_after_seconds": block,
                },
            )

    async def _emit(self, scope: CallScope, event: dict[str, Any]) -> None:
        if scope.emit is None:
            return
        try:
            await scope.emit({**event, "run_id": scope.run_id, "scope": scope.scope, **scope.who})
        except Exception:
            logger.warning("could not emit %s for run %s", event.get("type"), scope.run_id, exc_info=True)


def _wait_until(
    reservation: Reservation, model: str, key_id: str, resume_at: int, now: int, limit: str | None
) -> TurnWait:
    return TurnWait(max(0, resume_at - now) / 1000.0, limit, model, key_id, resume_at)


def decode_hold(raw: Any) -> tuple[Reservation, int, str | None] | None:
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        r = data["reservation"]
        reservation = Reservation(
            model=r["model"],
            key_id=r["key_id"],
            ticket=r["ticket"],
            wait_seconds=float(r["wait_seconds"]),
            limit=r.get("limit"),
            amounts=tuple(int(a) for a in r["amounts"]),  # type: ignore[arg-type]
            reserved_at_ms=int(r["reserved_at_ms"]),
            shift_ms=int(r.get("shift_ms") or 0),
        )
        return reservation, int(data["resume_at_ms"]), data.get("limit")
    except (ValueError, KeyError, TypeError):
        return None


def _retryable(exc: BaseException, status: int | None) -> bool:
    if status in RETRY_STATUSES:
        return True
    if status is not None or exc.__cause__ is None:
        return False
    import anthropic  # only a call of the Anthropic client has one as its cause

    return isinstance(exc.__cause__, anthropic.APIConnectionError)


def _default_model() -> str:
    from ...agent.anthropic_client import DEFAULT_MODEL  # lazily: scripted clients need no SDK

    return DEFAULT_MODEL


def _max_retries(inner: Any) -> int:
    value = getattr(inner, "max_retries", 2)
    return value if isinstance(value, int) and value >= 0 else 2


__all__ = [
    "RATE_LIMIT_RETRIES",
    "SHORT_WAIT_SECONDS",
    "CallScope",
    "LimitedModelClient",
    "RateLimitWait",
    "TurnWait",
    "current_scope",
    "decode_hold",
    "estimate_input_tokens",
    "hold_key",
    "remaining_of",
    "retry_after_seconds",
]
