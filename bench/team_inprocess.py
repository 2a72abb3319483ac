"""Handoff round trips per second of an in-process team, against a bare agent
doing one tool round trip, measured in the same run.

Workload (zero-latency stateless scripted models, ``stream=False``, no tracer):

* **baseline** -- a bare agent: model turn 1 calls one tool (``echo``), turn 2
  answers with text. One ``agent.prompt()`` = one tool round trip.
* **team** -- a team with one ``define_agent`` member (fresh session per work
  item): lead turn 1 hands off (``mode: "handoff"``), the member's turn 1 calls
  ``team_reply``, the lead resumes with the report and answers. One
  ``team.prompt()`` = one handoff round trip: lead -> member -> reply -> lead
  resumed. Run on ``MemoryMailbox`` and on ``RedisMailbox`` (127.0.0.1:6379, a
  unique key prefix, keys deleted afterwards).

Histories are reset between iterations (outside the timed region), so every
iteration does the same work. Sides are interleaved in rounds so machine drift
hits all of them. Printed: median round trips per second of each side and the
ratio of its time per round trip to the baseline's. Every iteration's result is
checked; a wrong outcome exits with status 1.

Run: ``python bench/team_inprocess.py [--iterations N] [--rounds N] [--redis-url URL]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from lattice_mailbox import MemoryMailbox
from lattice_worker import (
    AssistantModelMessage,
    ModelRequest,
    ScriptedModelClient,
    create_bare_agent,
    create_team,
    define_agent,
    team_member,
    text_turn,
    tool,
    tool_turn,
)


def _has_results(request: ModelRequest) -> bool:
    last = request.messages[-1]["content"]
    return isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)


# --------------------------------------------------------------------------- sides


@dataclass
class Side:
    name: str
    reset: Callable[[], Awaitable[None]]
    once: Callable[[], Awaitable[Any]]
    check: Callable[[Any], bool]
    rates: list[float] = field(default_factory=list)


def baseline_side() -> Side:
    @tool(name="echo", description="Echo the text.")
    def echo(text: str) -> str:
        return text

    def play(request: ModelRequest) -> AssistantModelMessage:
        if _has_results(request):
            return text_turn("echoed")
        return tool_turn(("echo", {"text": "hi"}))

    agent = create_bare_agent(name="bare", model_client=ScriptedModelClient(play), tools=[echo])

    async def reset() -> None:
        await agent.replace_history([])

    async def once() -> Any:
        return await agent.prompt("go", stream=False)

    return Side("baseline: bare agent, 1 tool round trip", reset, once, lambda r: r.result == "echoed")


def team_side(label: str, mailbox: Any) -> Side:
    def lead_play(request: ModelRequest) -> AssistantModelMessage:
        if _has_results(request) or len(request.messages) > 1:
            return text_turn("lead resumed")
        return tool_turn(("worker", {"mode": "handoff", "task": "reply with ok"}))

    def member_play(request: ModelRequest) -> AssistantModelMessage:
        return tool_turn(("team_reply", {"content": "ok"}))

    member = define_agent(name="worker", model_client=ScriptedModelClient(member_play))
    team = create_team(
        name=f"bench{uuid.uuid4().hex[:8]}",
        lead=create_bare_agent(name="lead", model_client=ScriptedModelClient(lead_play)),
        members=[team_member(name="worker", agent=member)],
        mailbox=mailbox,
    )

    async def reset() -> None:
        await team.lead.replace_history([])

    async def once() -> Any:
        return await team.prompt("go", stream=False)

    return Side(f"team handoff round trip ({label})", reset, once, lambda r: r.result == "lead resumed")


# --------------------------------------------------------------------------- measuring


async def measure(side: Side, iterations: int) -> float:
    """Round trips per second over ``iterations`` (resets untimed)."""
    total = 0.0
    for _ in range(iterations):
        await side.reset()
        start = time.perf_counter()
        result = await side.once()
        total += time.perf_counter() - start
        if not side.check(result):
            print(f"{side.name}: wrong outcome {result!r}", file=sys.stderr)
            raise SystemExit(1)
    return iterations / total


async def main_async(iterations: int, rounds: int, warmup: int, redis_url: str | None) -> int:
    sides = [baseline_side(), team_side("MemoryMailbox", MemoryMailbox())]
    redis_store = None
    prefix = f"bench-{uuid.uuid4().hex}"
    if redis_url:
        from lattice_mailbox.redis import RedisMailbox

        redis_store = RedisMailbox(redis_url, prefix=prefix)
        sides.append(team_side("RedisMailbox", redis_store))
    try:
        for side in sides:
            await measure(side, warmup)
        gc.collect()
        for _ in range(rounds):
            for side in sides:
                side.rates.append(await measure(side, iterations))
    finally:
        if redis_store is not None:
            client = redis_store.client()
            keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
            if keys:
                await client.delete(*keys)
            await redis_store.aclose()

    base = statistics.median(sides[0].rates)
    print(
        f"{iterations} iterations x {rounds} rounds per side (median of rounds), zero-latency scripted models"
    )
    width = max(len(s.name) for s in sides)
    for side in sides:
        rate = statistics.median(side.rates)
        per = 1e6 / rate
        ratio = base / rate
        print(
            f"  {side.name:<{width}}  {rate:9.1f} round trips/s  {per:8.1f} us each  x{ratio:5.2f} of baseline"
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--iterations", type=int, default=200, help="round trips per measurement (default 200)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="measurements per side (default 5)")
    parser.add_argument(
        "--warmup", type=int, default=50, help="untimed round trips per side first (default 50)"
    )
    parser.add_argument(
        "--redis-url", default="redis://127.0.0.1:6379/0", help="Redis for the RedisMailbox side ('' to skip)"
    )
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args.iterations, args.rounds, args.warmup, args.redis_url or None))


if __name__ == "__main__":
    sys.exit(main())
