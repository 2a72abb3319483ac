"""The connection policy (lattice_mailbox.connections) against real redis-server processes.

Each test starts its own ``redis-server`` (tests/support/redis_server.py): one
with ``timeout 1`` for idle closes, ``CLIENT KILL`` from a separate connection,
restarts. It pins the redis-py behaviour the policy relies on: a dead
connection is found and replaced before a command goes on it, a connect is
retried, and a command whose reply was lost (a proxy forwards it, then drops
the connection) is never sent again.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError

from lattice_client.runstore import RunStore
from lattice_mailbox.connections import (
    ASYNC_POOL_OPTIONS,
    CONNECT_RETRIES,
    UnreachableError,
    async_redis,
    read_again,
    read_again_blocking,
    sync_redis,
)
from tests.support.cutting_proxy import CuttingProxy
from tests.support.redis_server import RedisServer, free_port


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer("--timeout", "1") as s:
        yield s


def _count(server: RedisServer) -> int:
    with server.admin() as admin:
        return int(admin.get("n") or 0)


async def test_asyncio_clients_replace_killed_and_idle_closed_connections(server):
    client = async_redis(server.url)
    await client.incr("n")
    done = 1
    for _ in range(3):  # CLIENT KILL between commands: commands, pipelines, scripts
        assert server.kill_clients() >= 1
        await asyncio.sleep(0.05)
        await client.incr("n")
        async with client.pipeline(transaction=False) as pipe:
            pipe.incr("n").incr("n")
            await pipe.execute()
        assert server.kill_clients() >= 1
        await asyncio.sleep(0.05)
        await client.eval("return redis.call('INCR', KEYS[1])", 1, "n")
        done += 4
    for _ in range(2):  # idle longer than the server's timeout
        await asyncio.sleep(1.6)
        await client.incr("n")
        done += 1
    assert _count(server) == done  # every command ran once
    await client.aclose()


async def test_more_concurrent_commands_than_pooled_connections_wait_for_one(server):
    # 1,000 steps in flight on one asyncio pool process share one client: a command that
    # finds every connection in use waits for one (redis-py's default pool fails it at once)
    client = async_redis(server.url)
    limit = ASYNC_POOL_OPTIONS["max_connections"]
    try:
        replies = await asyncio.gather(*(client.blpop([f"q{i}"], timeout=0.2) for i in range(limit + 20)))
        assert replies == [None] * (limit + 20)
        with server.admin() as admin:
            assert int(admin.info("clients")["connected_clients"]) <= limit + 1  # (+ the admin)
    finally:
        await client.aclose()


async def test_an_idle_connection_killed_just_before_a_command_is_pinged_and_replaced(server):
    # the kill lands right before the command (the loop never saw the close): the
    # health-check PING fails, a new connection carries the command
    client = async_redis(server.url)
    await client.incr("n")
    await asyncio.sleep(1.1)  # idle past the health-check interval, below the server timeout
    server.kill_clients()
    await client.incr("n")
    assert _count(server) == 2
    await client.aclose()


def test_blocking_clients_replace_killed_and_idle_closed_connections(server):
    client = sync_redis(server.url)
    client.incr("n")
    for _ in range(3):
        server.kill_clients()
        client.incr("n")  # no pause: the blocking pool polls the socket
        pipe = client.pipeline(transaction=False)
        pipe.incr("n").incr("n")
        pipe.execute()
    time.sleep(1.6)
    client.incr("n")
    time.sleep(1.1)
    server.kill_clients()
    client.incr("n")
    assert _count(server) == 1 + 9 + 2
    client.close()


async def test_a_restart_between_commands_is_ridden_out(server):
    client = async_redis(server.url)
    blocking = sync_redis(server.url)
    await client.set("k", "a")
    blocking.set("k", "b")
    server.restart(down_for=0.3)  # a connect attempt fails meanwhile: retried
    assert await client.incr("n") == 1
    assert blocking.incr("n") == 2
    await client.aclose()
    blocking.close()


async def test_a_server_that_stays_down_fails_after_the_connect_retries():
    port = free_port()
    client = async_redis(f"redis://127.0.0.1:{port}/0")
    started = time.monotonic()
    with pytest.raises(UnreachableError):  # a ConnectionError
        await client.ping()
    assert time.monotonic() - started >= 1.0  # CONNECT_RETRIES waits (about 2.2 s) happened
    assert CONNECT_RETRIES >= 3
    with pytest.raises(UnreachableError):  # a read is not made again when connecting fails
        await read_again(client.ping)
    await client.aclose()


def test_wrong_credentials_are_not_retried():
    with RedisServer("--requirepass", "right") as s:
        client = sync_redis(f"redis://:wrong@127.0.0.1:{s.port}/0")
        started = time.monotonic()
        with pytest.raises(AuthenticationError):
            client.ping()
        assert time.monotonic() - started < 1.0
        client.close()


async def test_a_command_whose_reply_was_lost_is_never_sent_again(server):
    with CuttingProxy(server.port) as proxy:
        client = async_redis(proxy.url)
        blocking = sync_redis(proxy.url)
        await client.incr("n")
        blocking.incr("n")
        proxy.cut_reply_of(b"INCRBY")
        with pytest.raises(RedisConnectionError):
            await client.incrby("n", 10)
        proxy.cut_reply_of(b"INCRBY")
        with pytest.raises(RedisConnectionError):
            blocking.incrby("n", 100)
        proxy.cut_reply_of(b"INCRBY")
        pipe = client.pipeline(transaction=False)
        pipe.incrby("n", 1000)
        with pytest.raises(RedisConnectionError):
            await pipe.execute()
        assert proxy.cuts == 3
        assert _count(server) == 1112  # each ran exactly once: nothing was resent
        assert await client.incr("n") == 1113  # and the clients carry on on new connections
        assert blocking.incr("n") == 1114
        await client.aclose()
        blocking.close()


def test_policy_keywords_yield_to_the_callers():
    client = sync_redis("redis://127.0.0.1:1/0", health_check_interval=5, decode_responses=True)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["health_check_interval"] == 5 and kwargs["decode_responses"] is True
    assert kwargs["socket_keepalive"] is True
    client.close()
    unix = async_redis("unix:///tmp/nothing.sock")
    assert "socket_keepalive" not in unix.connection_pool.connection_kwargs
    assert type(unix.connection_pool.connection_class).__name__ != "UnixDomainSocketConnection"
    assert issubclass(unix.connection_pool.connection_class, aioredis.UnixDomainSocketConnection)
    assert issubclass(
        sync_redis("rediss://127.0.0.1:1/0").connection_pool.connection_class, redis.SSLConnection
    )


def test_a_connection_killed_while_its_loop_was_not_running_is_replaced(server):
    # as in a worker: one loop per thread, running only during a task; the kill lands
    # between two tasks, well within the health-check interval
    loop = asyncio.new_event_loop()
    try:
        client = async_redis(server.url)
        loop.run_until_complete(client.incr("n"))
        for _ in range(5):
            assert server.kill_clients() == 1
            loop.run_until_complete(client.incr("n"))
        assert _count(server) == 6
        loop.run_until_complete(client.aclose())
    finally:
        loop.close()


async def test_a_blocked_read_whose_connection_is_killed_is_read_again(server):
    client = async_redis(server.url)
    admin = server.admin()

    async def cut_then_add() -> None:
        await asyncio.sleep(0.3)
        assert server.kill_clients() >= 1  # the XREAD BLOCK in flight loses its connection
        await asyncio.sleep(0.3)
        admin.xadd("s", {"k": "v"})

    helper = asyncio.create_task(cut_then_add())
    with pytest.raises(RedisConnectionError):  # without read_again the read fails
        await client.xread({"s": "0-0"}, block=5000)
    await helper
    admin.delete("s")
    helper = asyncio.create_task(cut_then_add())
    reply = await read_again(lambda: client.xread({"s": "0-0"}, block=5000))
    await helper
    assert reply[0][1][0][1] == {b"k": b"v"}
    admin.close()
    await client.aclose()


def test_a_blocked_blocking_read_whose_connection_is_killed_is_read_again(server):
    client = sync_redis(server.url, decode_responses=True)
    admin = server.admin()

    def cut_then_add() -> None:
        time.sleep(0.3)
        server.kill_clients()
        time.sleep(0.3)
        admin.xadd("s", {"k": "v"})

    helper = threading.Thread(target=cut_then_add)
    helper.start()
    reply = read_again_blocking(lambda: client.xread({"s": "0-0"}, block=5000))
    helper.join()
    assert reply[0][1][0][1] == {"k": "v"}
    admin.close()
    client.close()


async def test_a_run_create_whose_reply_was_lost_is_decided_by_the_stored_record(server):
    with CuttingProxy(server.port) as proxy:
        store = RunStore(proxy.url, "test-conn")
        await store.create("warm", "team", "p")  # loads the scripts
        proxy.cut_reply_of(b"EVALSHA")  # Redis creates the run, the reply never arrives
        record = await store.create("r1", "team", "hello")
        assert proxy.cuts == 1
        stored = await store.get("r1")
        assert (stored.status.value, stored.prompt, stored.created_at) == (
            "queued",
            "hello",
            record.created_at,
        )
        with server.admin() as admin:
            assert admin.zscore(store.runs_index_key, "r1") == record.created_at
        with pytest.raises(ValueError, match="already exists"):  # created once, not twice
            await store.create("r1", "team", "hello")
        await store.create("r2", "team", "other")
        await asyncio.sleep(0.01)  # (a creation time in another millisecond)
        proxy.cut_reply_of(b"EVALSHA")  # an existing id: the stored record is not this call's
        with pytest.raises(RedisConnectionError):
            await store.create("r2", "team", "other")
        assert proxy.cuts == 2
        assert (await store.get("r2")).prompt == "other"
        await store.aclose()


async def test_the_clients_cancel_status_and_inbox_ride_out_a_lost_reply(server):
    # a cancel whose script reply is lost is made again (cancel.lua may run twice);
    # a message move to cancelled whose reply is lost is decided by reading the
    # message; status and inbox are reads, read again whole
    from lattice_client import AsyncLatticeClient

    with CuttingProxy(server.port) as proxy:
        client = AsyncLatticeClient(broker_url=proxy.url, key_prefix="test-conn")
        try:
            await client.runs.create("r1", "team", "hello")
            task = await client.mailbox.send("team::lead", "team::m", "do it", work_item_id="w1")
            await client.status("team")  # (loads the scripts: the cuts below hit EVALSHAs)
            assert [m.id for m in await client.inbox("team::m")] == [task.id]

            proxy.cut_reply_of(b"cancelled by request")  # cancel.lua runs; its reply is lost
            report = await client.cancel("r1")
            assert proxy.cuts == 1
            assert (report.previous_status.value, report.status.value) == ("queued", "cancelled")
            assert (await client.runs.get("r1")).status.value == "cancelled"

            # update_status(task, "cancelled") runs; its reply is lost
            proxy.cut_reply_of(task.id.encode() + b"\r\n$9\r\ncancelled")
            assert await client._cancel_message(task.id) is None
            assert proxy.cuts == 2
            assert (await client.mailbox.get(task.id)).status.value == "cancelled"

            proxy.cut_reply_of(b"SMEMBERS")  # status() reads the mailbox registry
            status = await client.status("team")
            assert proxy.cuts == 3 and status.mailboxes["team::m"]["cancelled"] == 1
            proxy.cut_reply_of(b"team::m")
            assert [m.id for m in await client.inbox("team::m", "all")] == [task.id]
            assert proxy.cuts == 4
        finally:
            await client.aclose()
