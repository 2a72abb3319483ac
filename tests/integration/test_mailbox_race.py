"""Race test per shared store (Redis, SQLite, PostgreSQL): 8 OS processes x 4
asyncio tasks claim from one mailbox of 1,000 messages with short leases while
a 9th process runs ``requeue_expired`` in a loop. Some claims deliberately
sleep past their lease, so requeues and fenced-out completions really happen.

Must hold (issue 4, docs/architecture.md "Crash"): every message completed
exactly once, none lost, none completed by a fenced-out claim (a stale
``complete`` raises ``ClaimTakenError``/``ClaimMissingError`` and writes nothing).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import queue
import signal
import time
import uuid
from typing import Any

import pytest

from lattice_mailbox import ClaimMissingError, ClaimTakenError, MessageStatus
from tests.support.services import PG_URL, REDIS_URL

MESSAGES = 1_000
WORKERS = 8
TASKS = 4
LEASE_S = 1.0
SLOW_EVERY = 100  # on their first claim these messages stall past the lease (10 of them)
STALL_LIMIT_S = 30.0
REAP_EVERY_S = 0.1
BOX = "race::member"
DEADLINE_S = 120  # a bound for a loaded machine, not a timing


def _open(kind: str, target: str) -> Any:
    if kind == "redis":
        from lattice_mailbox.redis import RedisMailbox

        return RedisMailbox(REDIS_URL, prefix=target)
    from lattice_mailbox.sql import SQLMailbox

    if kind == "sqlite":
        return SQLMailbox(f"sqlite:///{target}")
    return SQLMailbox(PG_URL, table_prefix=target)


def _worker(kind: str, target: str, number: int, stop: Any, results: Any) -> None:
    os.setpgid(0, 0)  # own process group: the test stops it by that id
    results.put(asyncio.run(_claim_loop(kind, target, number, stop)))


async def _claim_loop(kind: str, target: str, number: int, stop: Any) -> tuple[str, list[str], int]:
    mb = _open(kind, target)
    completed: list[str] = []
    fenced = 0

    async def task(t: int) -> None:
        nonlocal fenced
        while not stop.is_set():
            m = await mb.claim_next(BOX, lease_s=LEASE_S, worker_id=f"w{number}.{t}")
            if m is None:
                await asyncio.sleep(0.05)
                continue
            if m.attempts == 1 and int(m.content) % SLOW_EVERY == 0:
                await _stall_until_requeued(mb, m)
            try:
                await mb.complete(m.id, m.claim_token, MessageStatus.DONE)
            except (ClaimTakenError, ClaimMissingError):
                fenced += 1
            else:
                completed.append(m.id)

    await asyncio.gather(*(task(t) for t in range(TASKS)))
    await mb.aclose()
    return (f"worker-{number}", completed, fenced)


async def _stall_until_requeued(mb: Any, m: Any) -> None:
    """Play a stuck worker: keep the claim without renewing it until the
    reaper has taken the message back (requeued, maybe re-claimed or done)."""
    give_up = time.monotonic() + STALL_LIMIT_S
    while time.monotonic() < give_up:
        await asyncio.sleep(0.1)
        now = await mb.get(m.id)
        if now.status != MessageStatus.PROCESSING or now.attempts > m.attempts:
            return


def _reaper(kind: str, target: str, stop: Any, results: Any) -> None:
    os.setpgid(0, 0)
    results.put(asyncio.run(_reap_loop(kind, target, stop)))


async def _reap_loop(kind: str, target: str, stop: Any) -> tuple[str, list[str], int]:
    mb = _open(kind, target)
    moved: list[str] = []
    while not stop.is_set():
        moved.extend(m.id for m in await mb.requeue_expired())
        await asyncio.sleep(REAP_EVERY_S)
    await mb.aclose()
    return ("reaper", moved, 0)


async def _fill(mb: Any) -> list[str]:
    ids: list[str] = []
    for start in range(0, MESSAGES, 100):
        batch = await asyncio.gather(*(mb.send("race::lead", BOX, str(i)) for i in range(start, start + 100)))
        ids.extend(m.id for m in batch)
    return ids


async def _cleanup(kind: str, target: str, mb: Any) -> None:
    if kind == "redis":
        client = mb.client()
        keys = [k async for k in client.scan_iter(match=f"{target}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    elif kind == "postgres":
        from sqlalchemy import text

        def drop() -> None:
            with mb.engine.begin() as conn:
                conn.execute(text(f"DROP TABLE IF EXISTS {target}messages, {target}mailboxes"))

        await asyncio.to_thread(drop)
    await mb.aclose()


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param("redis", marks=pytest.mark.redis),
        pytest.param("sqlite"),
        pytest.param("postgres", marks=pytest.mark.postgres),
    ],
)
async def test_many_processes_complete_every_message_exactly_once(kind, tmp_path):
    target = {
        "redis": f"test-{uuid.uuid4().hex}",
        "sqlite": str(tmp_path / "race.db"),
        "postgres": f"race{uuid.uuid4().hex[:10]}_",
    }[kind]
    mb = _open(kind, target)
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    results = ctx.Queue()
    procs: list[Any] = []
    ids: list[str] = []
    reports: list[tuple[str, list[str], int]] = []
    try:
        ids = await _fill(mb)
        assert len(set(ids)) == MESSAGES
        procs = [ctx.Process(target=_worker, args=(kind, target, n, stop, results)) for n in range(WORKERS)]
        procs.append(ctx.Process(target=_reaper, args=(kind, target, stop, results)))
        for p in procs:
            p.start()
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if (await mb.counts(BOX))["done"] == MESSAGES:
                break
            if not any(p.is_alive() for p in procs):
                break
            await asyncio.sleep(0.25)
        stop.set()
        for _ in procs:
            reports.append(await asyncio.to_thread(results.get, True, 30))
        for p in procs:
            await asyncio.to_thread(p.join, 10)
    except queue.Empty:
        pytest.fail("a worker process did not report back")
    finally:
        stop.set()
        for p in procs:
            if p.is_alive():
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.join(5)
        final_counts = await mb.counts(BOX)
        slow = [mid for i, mid in enumerate(ids) if i % SLOW_EVERY == 0]
        slow_attempts = [(await mb.get(mid)).attempts for mid in slow]
        await _cleanup(kind, target, mb)

    completed = [mid for name, done, _ in reports if name != "reaper" for mid in done]
    fenced = sum(n for _, _, n in reports)
    requeued = [mid for name, moved, _ in reports if name == "reaper" for mid in moved]
    # every message completed exactly once, by a claim that still held it
    assert len(completed) == len(set(completed)) == MESSAGES
    assert set(completed) == set(ids)
    assert final_counts == {**{s.value: 0 for s in MessageStatus}, "done": MESSAGES}
    # requeues really happened, and the late completes were refused
    assert len(requeued) >= len(slow)
    assert fenced >= len(slow)
    assert all(a >= 2 for a in slow_attempts), slow_attempts
