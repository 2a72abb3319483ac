"""A session member's conversation written only under its current claim.

A session member's conversation (``<prefix>:session:<mailbox id>``, a Redis
list) is shared by every work item of its serial mailbox. A worker that lost
its claim -- it stalled past the lease, and another worker re-claimed the
message -- must not write to it any more: a tool result it records late, or
the error results of a batch it abandons, would land in the middle of the
next claim's turns (a ``tool_result`` that answers no ``tool_use`` of the turn
before it, which the provider refuses in every later request of the session).

So each claim first *takes* the conversation (:func:`take_session`): the fence
key (:meth:`~lattice_worker.runtime.run.keys.WorkerKeys.session_fence`, in the
list's cluster slot) then names that claim, by its ``lease_until`` (ms) and
its token; a claim older than the fence's is refused. A later claim of a
serial mailbox comes after the earlier one ended or its lease expired, so its
``lease_until`` is later: on the Redis mailbox's own clock, on a SQL
mailbox's the claiming workers' (which must agree to well within a lease; a
claim refused for a skewed clock is re-claimed once its lease expires). Every write of
:class:`FencedSessionStore` checks the fence in the same script and is
refused (:class:`~lattice_client.errors.ItemClaimLostError`) once another
claim took the conversation. The fence expires :data:`FENCE_TTL_MS` after
its claim's last take or write.
"""

from __future__ import annotations

from typing import Any

from lattice_client.errors import ItemClaimLostError
from lattice_mailbox.message import TeamMessage

from ...agent.history_stores import RedisHistoryStore, _check_messages, _decode_message, _encode_message
from ..run.context import WorkerContext
from ..run.replay import ReplayedTurn

_TAKE = """
local current = redis.call('GET', KEYS[2])
if current then
  local since = tonumber(string.match(current, '^(%d+)|'))
  if since and since > tonumber(ARGV[1]) then return redis.error_reply('FENCED') end
end
redis.call('SET', KEYS[2], ARGV[1] .. '|' .. ARGV[2], 'PX', ARGV[4])
if ARGV[3] == 'all' then return redis.call('LRANGE', KEYS[1], 0, -1) end
local last = redis.call('LINDEX', KEYS[1], -1)
if last then return {last} end
return {}
"""
"""KEYS: list, fence. ARGV: lease_until (ms), token, ``all`` | ``last``, the fence's TTL (ms).
Returns the list (or its last element)."""

_WRITE = """
local current = redis.call('GET', KEYS[2])
if not current or string.sub(current, -string.len(ARGV[1]) - 1) ~= '|' .. ARGV[1] then
  return redis.error_reply('FENCED')
end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
if ARGV[2] == 'replace' then redis.call('DEL', KEYS[1]) end
if #ARGV > 3 then return redis.call('RPUSH', KEYS[1], unpack(ARGV, 4)) end
return 0
"""
"""KEYS: list, fence. ARGV: token, ``append`` | ``replace``, the fence's TTL (ms), messages.
Returns the list's length."""

FENCE_TTL_MS = 7 * 24 * 3600 * 1000
"""How long (milliseconds) a session's fence is kept after the last take or write of its claim."""


class FencedSessionStore(ReplayedTurn, RedisHistoryStore):
    """The session conversation of ``message``'s mailbox, written only while
    ``message``'s claim holds it (see the module doc). ``run_id``: for the
    error. A turn it :meth:`~lattice_worker.runtime.run.replay.ReplayedTurn.hold` s
    stays stored until the model "returns" it; ``load`` then gives the
    conversation without it."""

    def __init__(self, ctx: WorkerContext, message: TeamMessage, run_id: str) -> None:
        super().__init__(ctx.client, ctx.keys.session(message.to), fail_on_error=True)
        self.fence = ctx.keys.session_fence(message.to)
        self.token = str(message.claim_token or "")
        self.run_id = run_id
        self.work_item_id = str(message.work_item_id or message.id)  # (for the error)

    async def _write(self, mode: str, values: list[bytes]) -> None:
        try:
            await self._redis().eval(_WRITE, 2, self.key, self.fence, self.token, mode, FENCE_TTL_MS, *values)
        except Exception as exc:
            if "FENCED" in str(exc):
                raise ItemClaimLostError(self.run_id, self.work_item_id, "write the session of") from exc
            raise

    async def load(self) -> list[dict[str, Any]]:
        held = self.held_history()
        return held if held is not None else await super().load()

    async def append(self, message: dict[str, Any]) -> None:
        if await self.append_held(message):
            return
        await self._write("append", [_encode_message(message, where="FencedSessionStore.append")])

    async def replace(self, messages: list[dict[str, Any]]) -> None:
        items = _check_messages(messages, where="FencedSessionStore.replace")
        self.release()
        await self._write("replace", [_encode_message(m, where="FencedSessionStore.replace") for m in items])


async def take_session(
    ctx: WorkerContext, message: TeamMessage, run_id: str, *, read_all: bool
) -> tuple[FencedSessionStore, list[dict[str, Any]]]:
    """Take ``message``'s session conversation for its claim (one script call)
    and read it: ``(store, messages)`` -- every message with ``read_all``, else
    only the last one (``[]`` when the conversation is empty). Raises
    :class:`~lattice_client.errors.RunLeaseLostError` when a later claim of the
    mailbox took it already (this claim must write nothing)."""
    store = FencedSessionStore(ctx, message, run_id)
    since = int(message.lease_until or 0)
    mode = "all" if read_all else "last"
    try:
        raw = await store._redis().eval(
            _TAKE, 2, store.key, store.fence, since, store.token, mode, FENCE_TTL_MS
        )
    except Exception as exc:
        if "FENCED" in str(exc):
            raise ItemClaimLostError(run_id, store.work_item_id, "take the session of") from exc
        raise
    return store, [m for m in (_decode_message(r) for r in raw) if m is not None]


__all__ = ["FENCE_TTL_MS", "FencedSessionStore", "take_session"]
