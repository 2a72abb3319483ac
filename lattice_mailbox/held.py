"""``EVALSHA`` over connections held out of a ``redis.asyncio`` client's pool.

The one place the mailbox goes around redis-py's command path
(``Redis.execute_command``: the pool's lock and observability hooks on every
checkout, a retry wrapper that never retries on the store's clients, the
release). Measured worth it: the handoff round trip of
``bench/distributed.py`` (one worker) was about 3.0x a Celery no-op with it
and about 3.9x with plain ``client.evalsha`` (three interleaved runs each).

It relies on these redis-py behaviours, pinned by ``tests/integration/test_held_connections.py``:

* ``ConnectionPool.get_connection()`` hands out a connected connection that
  the pool counts as in use until ``release``; ``Redis.aclose()`` closes the
  pool's connections, in use ones included (held ones need no closing of their own);
* ``Connection.can_read()`` is true for a connection with unread data and
  for one whose socket the server closed (``CLIENT KILL``, an idle
  ``timeout``) once the event loop has seen the close, without reading
  anything; ``disconnect()`` then ``connect()`` makes it a fresh connection.
  A held connection is checked that way before each reuse. (redis-py 8's own
  ``ConnectionPool.ensure_connection`` skips that check while maintenance
  notifications are ``"auto"``, its default, so it is not used here);
* ``Connection.send_command(...)`` then ``read_response()`` returns the
  ``EVALSHA`` reply as ``Redis.evalsha`` does (no response callback for
  EVALSHA), and raises ``NoScriptError`` / ``ResponseError`` for an error
  reply with the connection still usable;
* a ``read_response`` cancelled or failed mid-reply disconnects the
  connection (its state is unknown), so the next user reconnects.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

HELD_PER_LOOP = 4
"""Healthy connections kept per event loop between calls."""


class HeldConnections:
    """Per event loop: the client's healthy connections kept between ``EVALSHA`` calls.

    Only for clients whose owner built them without retries and without a
    response callback for ``EVALSHA`` (the mailbox's own clients): the call
    is then what ``client.evalsha`` does, minus its per-call bookkeeping.
    """

    def __init__(self, keep: int = HELD_PER_LOOP) -> None:
        self.keep = keep
        self._held: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, list[Any]]] = (
            weakref.WeakKeyDictionary()
        )

    async def evalsha(self, client: Any, sha: str, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        """``EVALSHA sha len(keys) *keys *args`` on ``client`` (a ``redis.asyncio.Redis``
        of the running loop). A held connection is checked before it is used
        again (unread data, or closed by the server: it is reconnected first).
        A connection error or timeout disconnects the connection and
        gives it back to the pool; an error reply (``NoScriptError``, a script
        error) is raised with the connection kept. Raises what redis-py raises."""
        pool = client.connection_pool
        loop = asyncio.get_running_loop()
        held = self._held.get(loop)
        if held is None or held[0] is not client:
            held = self._held[loop] = (client, [])
        idle = held[1]
        if idle:
            conn = idle.pop()
            try:
                await _fresh(conn)
            except BaseException:
                await pool.release(conn)
                raise
        else:
            conn = await pool.get_connection()
        keep = False
        try:
            await conn.send_command("EVALSHA", sha, len(keys), *keys, *args)
            result = await conn.read_response()
            keep = True
            return result
        except ResponseError:  # a whole reply was read: the connection is fine
            keep = True
            raise
        except (RedisConnectionError, RedisTimeoutError):
            await conn.disconnect()
            raise
        finally:
            if keep and len(idle) < self.keep:
                idle.append(conn)
            else:
                await pool.release(conn)

    def clear(self) -> None:
        """Forget every held connection (their client's ``aclose`` closes them)."""
        self._held.clear()


async def _fresh(conn: Any) -> None:
    """Make a held connection ready to send: reconnect it when it has unread
    data or the server closed it (its state is unknown then)."""
    if conn.is_connected:
        try:
            stale = await conn.can_read()
        except (RedisConnectionError, OSError):
            stale = True
        if not stale:
            return
        await conn.disconnect()
    await conn.connect()


__all__ = ["HELD_PER_LOOP", "HeldConnections"]
