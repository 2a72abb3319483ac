"""Mailbox store benchmark: send -> claim_next -> update_status cycles per second
for every backend, beside a baseline measured in the same run.

Baseline: a raw redis-py ``EVALSHA`` of a trivial script (``return 1``) over the
very client (connection pool) the ``RedisMailbox`` uses. The headline ratio is
the cost of one Redis ``claim_next`` (Lua script + key/token/validation work +
building the returned ``TeamMessage``) over one raw ``EVALSHA`` round trip;
target: <= 2x. Baseline and claim rounds are interleaved and the
median round is reported, so machine load hits both sides alike.

    python bench/mailbox.py [--cycles 2000] [--rounds 5] [--no-postgres]

Needs Redis on 127.0.0.1:6379 (``--redis-url``) and, unless ``--no-postgres``,
PostgreSQL (``--pg-url``). Uses a unique key prefix / table prefix and removes
its data afterwards. Numbers are printed, never asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lattice_mailbox import MemoryMailbox  # noqa: E402
from lattice_mailbox.redis import RedisMailbox  # noqa: E402
from lattice_mailbox.sql import SQLMailbox  # noqa: E402
from tests.support.sql_mailbox import drop_sql_mailbox  # noqa: E402

BOX = "bench::member"


async def cycles(mb: Any, n: int) -> float:
    """Seconds for ``n`` send -> claim_next -> update_status(done) cycles."""
    start = time.perf_counter()
    for i in range(n):
        await mb.send("bench::lead", BOX, f"job {i}")
        claimed = await mb.claim_next(BOX)
        await mb.update_status(claimed.id, "done")
    return time.perf_counter() - start


async def raw_evalsha(client: Any, sha: str, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        await client.evalsha(sha, 0)
    return time.perf_counter() - start


async def fill(mb: RedisMailbox, box: str, n: int) -> None:
    for i in range(n):
        await mb.send("bench::lead", box, f"job {i}")


async def claims(mb: RedisMailbox, box: str, n: int) -> float:
    """Seconds for ``n`` claims from a mailbox already holding ``n`` messages."""
    start = time.perf_counter()
    for _ in range(n):
        await mb.claim_next(box, lease_s=30, worker_id="bench")
    return time.perf_counter() - start


async def drop_redis(mb: RedisMailbox, prefix: str) -> None:
    client = mb.client()
    keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await mb.aclose()


async def main(args: argparse.Namespace) -> None:
    n, rounds = args.cycles, args.rounds
    prefix = f"bench-{uuid.uuid4().hex[:12]}"
    redis_mb = RedisMailbox(args.redis_url, prefix=prefix)
    client = redis_mb.client()
    sha = await client.script_load("return 1")
    tmp = tempfile.TemporaryDirectory()
    stores: dict[str, Any] = {
        "memory": MemoryMailbox(),
        "redis": redis_mb,
        "sqlite": SQLMailbox(f"sqlite:///{tmp.name}/bench.db"),
    }
    if not args.no_postgres:
        stores["postgresql"] = SQLMailbox(args.pg_url, table_prefix=f"bench{uuid.uuid4().hex[:10]}_")
    try:
        # warm-up: load scripts, create tables, open connections
        for mb in stores.values():
            await cycles(mb, 20)
        await raw_evalsha(client, sha, 50)
        await fill(redis_mb, "bench::warm", 50)
        await claims(redis_mb, "bench::warm", 50)

        # claim vs baseline: many short alternating batches, so load changes hit both sides
        base_s, claim_s, ratios = [], [], []
        batch = 100
        for b in range(max(1, (n * rounds) // batch)):
            await fill(redis_mb, f"bench::claims{b}", batch)
            base_s.append(await raw_evalsha(client, sha, batch) / batch)
            claim_s.append(await claims(redis_mb, f"bench::claims{b}", batch) / batch)
            ratios.append(claim_s[-1] / base_s[-1])
        cycle_s: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(rounds):
            for name, mb in stores.items():
                per = n if name in ("memory", "redis") else max(50, n // 10)
                cycle_s[name].append(await cycles(mb, per) / per)

        base = statistics.median(base_s)
        claim = statistics.median(claim_s)
        ratio = statistics.median(ratios)
        print(f"mailbox benchmark: {n} cycles per round, {rounds} rounds (median round shown);")
        print(f"claim_next vs raw EVALSHA: {len(ratios)} alternating batches of {batch} calls (medians)")
        print()
        print(f"{'backend':<12}{'cycles/s':>12}{'us/cycle':>12}{'x raw EVALSHA':>16}")
        for name, samples in cycle_s.items():
            sec = statistics.median(samples)
            print(f"{name:<12}{1 / sec:>12.0f}{sec * 1e6:>12.1f}{sec / base:>16.2f}")
        print()
        print(
            f"baseline  raw EVALSHA 'return 1' (same client): {base * 1e6:8.1f} us/call  ({1 / base:.0f}/s)"
        )
        print(
            f"RedisMailbox.claim_next (lease, worker id):     {claim * 1e6:8.1f} us/call  ({1 / claim:.0f}/s)"
        )
        verdict = "OK" if ratio <= 2.0 else "OVER TARGET"
        print(
            f"ratio claim_next / raw EVALSHA (median of batch ratios): {ratio:.2f}x  (target <= 2x: {verdict})"
        )
    finally:
        await drop_redis(redis_mb, prefix)
        if "postgresql" in stores:
            await drop_sql_mailbox(stores["postgresql"])
        await stores["sqlite"].aclose()
        tmp.cleanup()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000, help="operations per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/test")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL store")
    asyncio.run(main(parser.parse_args()))
