"""The cluster clients of lattice_mailbox.connections against the session's Redis Cluster.

A cluster URL gives redis-py's ``RedisCluster`` (sync and asyncio) with the
connection policy on every node connection. Pinned here: MOVED is followed
(a client built before a failover finds the slot's new master); a command
the cluster did not run while a master was down (no connection to the dead
node, ``CLUSTERDOWN``) is sent again until the replica took over; a command
whose reply was lost (its master killed while it waited) is not sent again:
the caller gets ``redis.exceptions.ConnectionError``.
"""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
import redis.asyncio.cluster as aiocluster
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError

from lattice_mailbox.connections import async_redis, sync_redis

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


@pytest.fixture
def key(redis_cluster):
    """A key of the test's own prefix (deleted afterwards)."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    yield f"{prefix}:k"
    redis_cluster.delete_prefix(prefix)


def test_a_cluster_url_gives_cluster_clients_with_the_policy_on_every_node(redis_cluster, key):
    blocking = sync_redis(redis_cluster.url, decode_responses=True)
    try:
        assert isinstance(blocking, RedisCluster)
        blocking.set(key, "v")
        assert blocking.get(key) == "v"
        pool = blocking.get_node_from_key(key).redis_connection.connection_pool
        assert pool.connection_class.__name__.startswith("Lattice")  # the policy's connection class
    finally:
        blocking.close()

    async def main() -> None:
        client = async_redis(redis_cluster.url, decode_responses=True)
        try:
            assert isinstance(client, aiocluster.RedisCluster)
            assert await client.get(key) == "v"
            assert {n.connection_class.__name__ for n in client.get_nodes()} == {"LatticeConnection"}
        finally:
            await client.aclose()

    asyncio.run(main())


def test_redirects_and_a_dead_master_are_waited_out(redis_cluster, key):
    client = sync_redis(redis_cluster.url, decode_responses=True)
    try:
        client.set(key, "1")
        # a coordinated failover: the client's slot map is stale, MOVED sends it to the new master
        moved_to = redis_cluster.failover(redis_cluster.master_of(key))
        assert client.incr(key) == 2
        assert redis_cluster.master_of(key) == moved_to
        # kill -9 of the master: the commands the cluster does not run meanwhile are sent again
        redis_cluster.kill_master(moved_to)
        assert client.incr(key) == 3  # after a replica took over (the write had replicated)
        redis_cluster.wait_promoted(moved_to)
        assert redis_cluster.master_of(key) != moved_to
    finally:
        client.close()
        redis_cluster.restart_node(moved_to)


def test_a_command_whose_master_dies_under_it_is_not_sent_again(redis_cluster, key):
    victim = redis_cluster.master_of(key)

    async def main() -> None:
        client = async_redis(redis_cluster.url)
        try:
            await client.ping()
            killer = threading.Timer(0.5, redis_cluster.kill_master, args=(victim,))
            killer.start()
            # a BLPOP sent again would wait its 8 s on the new master and return None
            with pytest.raises(RedisConnectionError):
                await client.blpop([key], timeout=8)
            killer.join()
        finally:
            await client.aclose()

    try:
        asyncio.run(main())
    finally:
        redis_cluster.wait_promoted(victim)
        redis_cluster.restart_node(victim)
