"""Figure (o) of ``bench/distributed.py``: how far one Redis goes.

``--runs-o`` runs (400), each one handoff (submit -> lead -> member -> lead ->
result, three steps) with zero model latency, all submitted at once, on
``--workers-o`` worker processes (2) consuming every queue at their default
settings. Measured on the bench's own ``redis-server`` (nothing else uses it)
over the whole batch: the handoffs per second, the Redis server's CPU (user +
system from ``INFO cpu``, deltas) per handoff and as a share of one core, and
the Redis commands per handoff (``INFO commandstats`` deltas: every client, the
bench's own submits and waits included, commands run inside Lua scripts
counted too), with the five most frequent commands and the five that take the
most of Redis's command time (``usec`` of ``INFO commandstats``).

The Redis CPU per handoff also counts what the workers do while idle (Celery's
polls, heartbeats), so the ceiling errs low. Only meaningful on the bench's own
``redis-server`` (the default, not ``--broker-url``).

Baseline, in the same run on the same server: a flood of ``GET`` s pipelined 100
at a time from the bench process; its Redis CPU per command gives the
server's own speed on this machine. Printed: the Redis CPU of one handoff as a
number of ``GET`` s, and the **ceiling**: the handoffs per second one Redis
would serve at 100% of its one command thread (1 / its CPU per handoff). Redis
runs commands on one thread, so that ceiling holds however many workers are
added; past it, the mailboxes and runs go to a Redis Cluster
(docs/deploy.md, "Redis Cluster for mailboxes and runs"), whose masters each
take their share of the hash tags.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from typing import Any

from distributed_procs import Bench, run_batch

BASELINE_GETS = 50_000
"""``GET`` s of the baseline flood."""


def _cpu_seconds(client: Any) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _command_calls(client: Any) -> Counter[str]:
    """``{command: calls}`` and ``{command + " us": microseconds spent}`` (``INFO commandstats``)."""
    calls: Counter[str] = Counter()
    for name, v in client.info("commandstats").items():
        calls[name.removeprefix("cmdstat_")] = int(v["calls"])
        calls[name.removeprefix("cmdstat_") + " us"] = int(v["usec"])
    return calls


def _baseline(client: Any) -> float:
    """Redis CPU seconds per pipelined ``GET`` (a flood of :data:`BASELINE_GETS`)."""
    client.set("bench-ceiling-key", "x")
    cpu0 = _cpu_seconds(client)
    for _ in range(BASELINE_GETS // 100):
        pipe = client.pipeline(transaction=False)
        for _ in range(100):
            pipe.get("bench-ceiling-key")
        pipe.execute()
    cpu = _cpu_seconds(client) - cpu0
    client.delete("bench-ceiling-key")
    return cpu / BASELINE_GETS


def _batch(bench: Bench, runs: int, workers: int) -> dict[str, Any]:
    from lattice_client import LatticeClient

    procs = [bench.lattice_worker() for _ in range(workers)]
    for proc in procs:
        proc.wait_ready()
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    info = bench.redis()
    try:
        client.submit("bench", "warm-up").wait(timeout=120)
        cpu0, calls0 = _cpu_seconds(info), _command_calls(info)
        elapsed = run_batch(client, runs)
        cpu, calls = _cpu_seconds(info) - cpu0, _command_calls(info) - calls0
    finally:
        client.close()
        info.close()
        bench.stop_all()
    return {"elapsed": elapsed, "cpu": cpu, "calls": calls}


def figure_o(bench: Bench, args: argparse.Namespace, load: Callable[[], str]) -> None:
    """Print figure (o) (``load()``: the machine's load average, printed before each rep)."""
    print()
    print(f"(o) one Redis's ceiling: {args.runs_o} handoffs at zero model latency, all submitted at once, on "
          f"{args.workers_o} worker processes;")  # fmt: skip
    print("    the Redis server's CPU (INFO cpu) and commands (INFO commandstats) over the batch, beside")
    print(f"    a flood of {BASELINE_GETS} pipelined GETs on the same server (its CPU per command)")
    if args.broker_url:
        print("    NOTE: --broker-url given: the server's CPU and commands include whatever else uses it")
    ceilings: list[float] = []
    for rep in range(args.repeats_o):
        print(f"    {load()}")
        client = bench.redis()
        try:
            per_get = _baseline(client)
        finally:
            client.close()
        figure = _batch(bench, args.runs_o, args.workers_o)
        runs = args.runs_o
        per_handoff = figure["cpu"] / runs
        ceiling = 1 / per_handoff if per_handoff > 0 else float("inf")
        ceilings.append(ceiling)
        counted: Counter[str] = figure["calls"]
        calls = Counter({k: v for k, v in counted.items() if not k.endswith(" us")})
        spent = Counter({k[:-3]: v for k, v in counted.items() if k.endswith(" us")})
        top = ", ".join(f"{name} {n / runs:.1f}" for name, n in calls.most_common(5))
        slow = ", ".join(f"{name} {us / runs:.0f} us" for name, us in spent.most_common(5))
        print(
            f"    rep {rep + 1} {runs / figure['elapsed']:7.1f} handoffs/s; Redis CPU {per_handoff * 1e6:6.0f} us per "
            f"handoff = {per_handoff / per_get:5.0f}x a pipelined GET ({per_get * 1e6:.2f} us), Redis busy "
            f"{figure['cpu'] / figure['elapsed'] * 100:4.0f}% of one core; {sum(calls.values()) / runs:5.1f} "
            f"commands per handoff ({top}); the most command time per handoff: {slow}; "
            f"ceiling of one Redis {ceiling:7.0f} handoffs/s",
            flush=True,
        )
    ceilings.sort()
    print(f"    one Redis's ceiling median {ceilings[len(ceilings) // 2]:.0f} handoffs/s "
          f"(spread {ceilings[0]:.0f}-{ceilings[-1]:.0f}, {len(ceilings)} reps)")  # fmt: skip
