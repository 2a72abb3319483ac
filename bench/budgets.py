"""What a token budget costs a distributed run, against the same run without one, measured in the same run.

Workload: the "e2e_budget" team of ``tests/e2e/budget_teams.py`` (zero-latency
stateless scripted models, every call reporting 350 tokens): the lead asks its
member ``--asks`` times one after another; each ask is one lead call and two
member calls. The task bodies (``run_lead``, ``deliver``, ``resume_lead``) run
in this process on one worker context against the real Redis (a unique key
prefix, keys deleted afterwards); the tasks they send are run in order.

* **baseline** -- the run without a budget;
* **budget** -- the same run with a budget it never reaches: before each model
  call the step checks the spend and reserves the call (``reserve_budget.lua``,
  one round trip, with the previous call's queued ``spend_budget.lua`` that
  counts it and releases its reservation); a renewal task per call in flight.

Sides alternate run by run (machine drift hits both). Printed: the median time
per run of each side, per model call, and the ratio budget / baseline. Every
run's result and spend are checked; a wrong outcome exits with status 1.

Run: ``python bench/budgets.py [--runs N] [--asks N] [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK  # noqa: E402
from lattice_client.runstore import RunStore  # noqa: E402
from lattice_client.settings import get_settings  # noqa: E402
from lattice_mailbox.redis import RedisMailbox  # noqa: E402
from lattice_worker.runtime.lead import segment as lead_segment  # noqa: E402
from lattice_worker.runtime.member import step as member_step  # noqa: E402
from lattice_worker.runtime.run.context import WorkerContext  # noqa: E402
from lattice_worker.runtime.worker.registry import TeamRegistry  # noqa: E402
from tests.e2e.budget_teams import run_tokens  # noqa: E402

BODIES = {
    RUN_LEAD_TASK: lead_segment.run_lead,
    DELIVER_TASK: member_step.deliver,
    RESUME_LEAD_TASK: lead_segment.resume_lead,
}


async def one_run(
    ctx: WorkerContext, queue: list[tuple[str, list[str]]], asks: int, budget: int | None
) -> float:
    run_id = f"run_{uuid.uuid4().hex[:12]}"
    await ctx.runs.create(run_id, "e2e_budget", str(asks), budget_tokens=budget)
    queue.append((RUN_LEAD_TASK, [run_id]))
    started = time.perf_counter()
    while queue:
        name, args = queue.pop(0)
        await BODIES[name](ctx, *args)
    await ctx.writer.flush()
    elapsed = time.perf_counter() - started
    record = await ctx.runs.get(run_id)
    if record is None or record.status.value != "completed":
        raise SystemExit(f"run {run_id} did not complete: {record}")
    if budget is not None and record.spent_tokens != run_tokens(asks):
        raise SystemExit(f"run {run_id} spent {record.spent_tokens}, expected {run_tokens(asks)}")
    return elapsed


async def main(runs: int, asks: int, redis_url: str) -> None:
    prefix = f"bench-budget-{uuid.uuid4().hex[:8]}"
    settings = get_settings(broker_url=redis_url, key_prefix=prefix)
    mailbox = RedisMailbox(redis_url, prefix=prefix)
    registry = TeamRegistry(mailbox)
    registry.load("tests.e2e.budget_teams:team")
    queue: list[tuple[str, list[str]]] = []
    ctx = WorkerContext(
        settings=settings,
        registry=registry,
        mailbox=mailbox,
        runs=RunStore(redis_url, prefix),
        send_task=lambda name, args, q: queue.append((name, list(args))),
    )
    times: dict[str, list[float]] = {"baseline": [], "budget": []}
    try:
        for _ in range(3):  # warm-up: scripts loaded, connections open
            await one_run(ctx, queue, asks, None)
            await one_run(ctx, queue, asks, 10**12)
        for i in range(runs):
            order = [("baseline", None), ("budget", 10**12)]
            for side, budget in order if i % 2 == 0 else order[::-1]:
                times[side].append(await one_run(ctx, queue, asks, budget))
    finally:
        await ctx.writer.aclose()
        await ctx.runs.aclose()
        await mailbox.aclose()
        raw = redis.Redis.from_url(redis_url)
        keys = list(raw.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            raw.delete(*keys)
        raw.close()
    calls = asks + 1 + 2 * asks
    base, budgeted = statistics.median(times["baseline"]), statistics.median(times["budget"])
    print(f"budget overhead: {runs} runs per side, {asks} asks = {calls} model calls per run")
    for side, value in (("baseline (no budget)", base), ("budget (never reached)", budgeted)):
        print(f"  {side:24s} {value * 1000:8.2f} ms/run  {value * 1000 / calls:6.3f} ms/call")
    print(f"  ratio budget/baseline: {budgeted / base:.3f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--asks", type=int, default=5)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    options = parser.parse_args()
    asyncio.run(main(options.runs, options.asks, options.redis_url))
