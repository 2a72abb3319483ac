"""The cost of the connection policy's dead-connection check, per command.

``lattice_mailbox.connections`` polls the socket of every asyncio connection the
pool hands out (one zero-timeout ``poll``; it reads redis-py's private
``Connection._writer``). The alternative within redis-py's public API that also
finds a connection closed while the event loop was not running is a ``PING``
before every command (``health_check_interval`` tiny). This measures, on the
Redis of ``LATTICE_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``),
the median time of one ``GET`` (microseconds) with:

* ``plain``: ``redis.asyncio.Redis.from_url`` (no check at all; a killed
  connection fails the next command);
* ``policy``: ``async_redis`` (the socket poll, health check after 1 s idle);
* ``ping-each``: a ``PING`` round trip before every command, on a plain
  client: what a health check before every command costs (redis-py's own,
  ``health_check_interval`` tiny, cannot be used: on Redis < 7.2 it lands
  inside the connect handshake and reads the reply of ``CLIENT SETINFO``).

Rounds interleave the three (machine drift hits all alike). Run:
``python bench/connections.py [--commands 2000] [--rounds 7]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

import redis.asyncio as aioredis

from lattice_mailbox.connections import async_redis


async def _per_command_us(client: aioredis.Redis, n: int, ping: bool = False) -> float:
    started = time.perf_counter()
    for _ in range(n):
        if ping:
            await client.ping()
        await client.get("lattice-bench-connections")
    return (time.perf_counter() - started) / n * 1e6


async def main(commands: int, rounds: int) -> None:
    url = os.environ.get("LATTICE_BENCH_REDIS_URL") or "redis://127.0.0.1:6379/0"
    clients = {
        "plain": aioredis.Redis.from_url(url),
        "policy": async_redis(url),
        "ping-each": aioredis.Redis.from_url(url),
    }
    figures: dict[str, list[float]] = {name: [] for name in clients}
    for name, client in clients.items():
        await _per_command_us(client, 200, ping=name == "ping-each")  # warm-up
    for _ in range(rounds):
        for name, client in clients.items():
            figures[name].append(await _per_command_us(client, commands, ping=name == "ping-each"))
    for name, values in figures.items():
        print(f"{name:10s} {statistics.median(values):8.1f} us per command")
    base = statistics.median(figures["plain"])
    for name in ("policy", "ping-each"):
        print(f"{name:10s} {statistics.median(figures[name]) / base:8.2f} x plain")
    for client in clients.values():
        await client.aclose()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.commands, args.rounds))
