"""The redis-py behaviour ``lattice_mailbox.held`` relies on, against the real Redis.

``HeldConnections`` sends the mailbox's hot ``EVALSHA`` calls over connections
it keeps out of the client's pool between calls (measured worth it, see its
module doc). These tests pin what it assumes of redis-py, so an upgrade that
changes any of it fails here rather than in a deployment.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError, ResponseError

from lattice_mailbox.held import HeldConnections

pytestmark = [pytest.mark.redis, pytest.mark.timeout(30)]

REDIS_URL = "redis://127.0.0.1:6379/0"
ECHO = "return {ARGV[1], KEYS[1]}"
FAILS = "return redis.error_reply('LATTICE broken on purpose')"


def _sha(source: str) -> str:
    return hashlib.sha1(source.encode()).hexdigest()


@pytest.fixture
async def client():
    # built as RedisMailbox builds its own clients: no automatic retries
    c = aioredis.Redis.from_url(REDIS_URL, retry=Retry(NoBackoff(), 0))
    await c.script_load(ECHO)
    await c.script_load(FAILS)
    yield c
    await c.aclose()


def _held_list(held: HeldConnections) -> list:
    return held._held[asyncio.get_running_loop()][1]


async def _client_id(conn) -> int:
    await conn.send_command("CLIENT", "ID")
    return int(await conn.read_response())


async def test_the_reply_is_what_client_evalsha_returns_and_the_connection_is_kept(client):
    held = HeldConnections(keep=2)
    key = f"test-{uuid.uuid4().hex}"
    direct = await client.evalsha(_sha(ECHO), 1, key, "hello")
    assert await held.evalsha(client, _sha(ECHO), [key], ["hello"]) == direct == [b"hello", key.encode()]
    [conn] = _held_list(held)
    assert conn.is_connected
    # the next call reuses it
    assert await held.evalsha(client, _sha(ECHO), [key], ["again"]) == [b"again", key.encode()]
    assert _held_list(held) == [conn]


async def test_closing_the_client_closes_the_held_connections():
    c = aioredis.Redis.from_url(REDIS_URL, retry=Retry(NoBackoff(), 0))
    await c.script_load(ECHO)
    held = HeldConnections()
    await held.evalsha(c, _sha(ECHO), ["k"], ["v"])
    [conn] = _held_list(held)
    assert conn in c.connection_pool._in_use_connections  # counted as in use, so aclose reaches it
    await c.aclose()
    assert not conn.is_connected


async def test_a_held_connection_the_server_closed_is_reconnected_before_its_next_use(client):
    held = HeldConnections()
    await held.evalsha(client, _sha(ECHO), ["k"], ["v"])
    [conn] = _held_list(held)
    old_id = await _client_id(conn)
    killer = aioredis.Redis.from_url(REDIS_URL)
    try:
        assert await killer.execute_command("CLIENT", "KILL", "ID", old_id) == 1
    finally:
        await killer.aclose()
    await asyncio.sleep(0.05)  # the close reaches the socket
    # ensure_connection finds the dead socket and reconnects: the call succeeds, on a new server client
    assert await held.evalsha(client, _sha(ECHO), ["k"], ["after"]) == [b"after", b"k"]
    assert _held_list(held) == [conn]
    assert await _client_id(conn) != old_id


async def test_a_held_connection_with_unread_data_never_yields_a_stale_reply(client):
    held = HeldConnections()
    await held.evalsha(client, _sha(ECHO), ["k"], ["v"])
    [conn] = _held_list(held)
    await conn.send_command("PING")  # a reply left unread
    await asyncio.sleep(0.05)
    assert await held.evalsha(client, _sha(ECHO), ["k"], ["fresh"]) == [b"fresh", b"k"]


async def test_can_read_flags_unread_data_and_a_server_closed_socket_without_reading(client):
    conn = await client.connection_pool.get_connection()
    try:
        assert await conn.can_read() is False  # idle and healthy
        await conn.send_command("PING")
        await asyncio.sleep(0.05)
        assert await conn.can_read() is True  # a reply waits
        assert await conn.read_response() == b"PONG"  # and was not consumed by the check
        killer = aioredis.Redis.from_url(REDIS_URL)
        try:
            await killer.execute_command("CLIENT", "KILL", "ID", await _client_id(conn))
        finally:
            await killer.aclose()
        await asyncio.sleep(0.05)
        assert await conn.can_read() is True  # the close was seen
    finally:
        await client.connection_pool.release(conn)


async def test_error_replies_raise_and_keep_the_connection(client):
    held = HeldConnections()
    with pytest.raises(NoScriptError):
        await held.evalsha(client, "0" * 40, ["k"], [])
    [conn] = _held_list(held)
    with pytest.raises(ResponseError, match="LATTICE broken on purpose"):
        await held.evalsha(client, _sha(FAILS), ["k"], [])
    assert _held_list(held) == [conn] and conn.is_connected
    assert await held.evalsha(client, _sha(ECHO), ["k"], ["ok"]) == [b"ok", b"k"]


async def test_a_read_cancelled_mid_reply_disconnects_the_connection(client):
    # what makes it safe to hand such a connection back: redis-py drops it
    conn = await client.connection_pool.get_connection()
    try:
        await conn.send_command("BLPOP", f"test-{uuid.uuid4().hex}", 5)
        read = asyncio.ensure_future(conn.read_response())
        await asyncio.sleep(0.1)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        assert not conn.is_connected
    finally:
        await client.connection_pool.release(conn)
    # the next call (a connection from the pool) works
    held = HeldConnections()
    assert await held.evalsha(client, _sha(ECHO), ["k"], ["next"]) == [b"next", b"k"]
