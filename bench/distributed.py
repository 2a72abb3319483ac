"""The distributed runtime on real worker processes, each figure beside a baseline from the same run.

(a) **Handoff round trip** (targets: <= 1.6x the stock chain's latency and
    <= 1.4x its worker CPU). One run = submit -> the lead hands off to one
    member -> the member replies -> the lead answers -> the client has the
    final result (``RunHandle.wait``): three Celery tasks (``run_lead``,
    ``deliver``, ``resume_lead``), zero-latency scripted models, the lead and
    the member on SEPARATE ``lattice worker`` processes (the README's layout:
    ``--member lead`` and ``--member echo``, default pool). Baselines, from a
    **stock** Celery app (``Celery(name, broker, backend)`` on the same Redis,
    none of the project's configuration; its workers on Celery's defaults
    with ``-E``): a no-op round trip (``send_task(...).get()``) and the floor
    Celery alone sets for the handoff's three steps, a chain of three no-op
    tasks across two workers (``bench.chain`` on the first worker sends the
    next hop to the second, which sends ``bench.noop`` back to the first; the
    client waits for its result). Interleaved run by run after a warm-up;
    medians in milliseconds and the ratios. Worker CPU: user + system time
    of the lead's and the member's worker processes over the measured rounds,
    per handoff, beside the two chain workers' per chain (they run nothing
    else). Also printed: the worker-side Redis round trips per handoff (every
    request a worker process writes to Redis -- a pipeline is one -- counted
    in the workers by the bench's instrumentation, split into the runtime's
    own asyncio clients and Celery/kombu's blocking ones) and the commands
    per handoff (``INFO commandstats`` deltas of the bench's own Redis,
    client included). Two deployments, paired run by run: ``handoff`` (the
    bench team's agents with ``workspace=False``) and ``workspace`` (the same
    agents with a workspace: the built-in file, search and shell tools of
    ``define_agent``'s default). ``--chain-variants``: stock chains beside the
    stock one (no events, late acks, prefetch 1, every hop's result stored),
    what each of Celery's knobs costs per three steps.
    ``--trace``: first the Redis requests of one handoff, both workers' in time
    order (ms since the submit; a script call shows its first key's tag),
    ``--trace-latency`` seconds per model call.
(b) **Many calls in flight** (target >= 0.9 of ideal with >= 200 calls in
    flight). ``--runs-b`` runs (1,000) with ``--latency-b`` seconds (2 s) of
    model latency per call, 3 calls per run, on ONE ``lattice worker``
    process consuming every queue at its recommended settings (the default
    asyncio pool; ``--concurrency-b`` steps in flight, 200 unless given). Ideal: ``concurrency / (3 * latency)``
    runs/s. Printed: runs/s, the fraction of ideal, the process's peak
    resident memory and CPU per step. Beside it the prefork pool
    (``--prefork-concurrency`` processes, fewer runs) and, with
    ``--variants``, other set-ups (``asyncio@N``: N steps in flight;
    ``threads@N``: Celery's threads pool with N threads; ``stock-transport@N``:
    the default pool on kombu's own Redis transport instead of
    ``lattice_client/kombu_redis.py``, which reuses one redis-py client per
    channel). The baseline, in the same run: a **stock** Celery worker (the
    no-op app of (a), ``-E``; ``solo``, Celery's one-process floor, and
    ``prefork`` with one process) draining ``--stock-tasks-b`` no-op tasks
    sent at once: its tasks/s and CPU per task, beside which the runtime's CPU
    per step is printed as a ratio, and the CPU budget per step one process
    has at the figure's calls in flight (``latency / concurrency``): at
    1,000 calls of 2 s, 500 steps/s, 2 ms per step on one CPU.
(d) **The tool journal's cost** (target <= 1.25x). The same handoff round
    trip with a member that calls one tool (unguarded, so journaled: recorded
    ``started`` before the handler, ``completed`` after, its history persisted
    per work item; ``docs/tool-effects.md``) before replying, with the journal
    (the default) beside a deployment without it (``LATTICE_TOOL_JOURNAL=0``),
    each under its own key prefix, side by side and paired run by run.
    Printed: medians and the ratio journaled / not journaled.
(r) **RabbitMQ as the broker** (``--figures r``). The handoff round trip of
    (a) on two deployments side by side, paired run by run: broker Redis, and
    broker RabbitMQ (``--amqp-url``, quorum queues) with the mailboxes, runs
    and registry on the same Redis. Printed: medians and RabbitMQ / Redis.
(o) **One Redis's ceiling** (``--figures o``; ``distributed_ceiling.py``).
    ``--runs-o`` handoffs (400) at zero model latency on ``--workers-o``
    worker processes (2): handoffs/s, the Redis server's CPU per handoff
    (``INFO cpu`` deltas) beside its CPU per pipelined ``GET`` in the same
    run, the commands per handoff (``INFO commandstats`` deltas), and the
    handoffs/s one Redis serves at 100% of its command thread.
(c) **Throughput scaling** (target >= 0.8 of linear). ``--runs-c`` runs (200),
    100 ms per model call, all submitted at once, on 1, 2 and 4 worker
    processes (``--concurrency 1`` each): runs/s and
    ``throughput(N) / (N * throughput(1))``.

By default the bench starts its own ``redis-server`` on a free port (so its
command counts are its own, and other users of a shared Redis do not move
its figures); ``--broker-url`` uses an existing one under a fresh key prefix
(keys deleted at the end). Workers are subprocesses in their own process
groups, stopped by group id. The load average is printed before each figure.

Run: ``python bench/distributed.py [--figures a,d,b,c] [--repeats N] [--trace] ...``.

This module is the command and the figures; beside it: ``distributed_teams.py``
(what the workers import: the bench teams, the no-op Celery app, the Redis
request counting), ``distributed_procs.py`` (Redis and the worker processes),
``distributed_handoff.py`` (the deployments and round trips of (a) and (d)).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from typing import Any

from distributed_ceiling import figure_o
from distributed_handoff import VARIANTS, Deployment, round_trips, trace_one_handoff
from distributed_procs import Bench, run_batch
from distributed_teams import STOCK_TRANSPORT_ENV, TOOL_TEAM_REF


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --------------------------------------------------------------------------- (a), (d) handoff round trips


def figure_a(bench: Bench, args: argparse.Namespace) -> None:
    print()
    print("(a) handoff round trip: submit -> lead (worker 1) -> member (worker 2) -> lead -> result;")
    print(
        "    beside a STOCK Celery app (Celery(broker, backend), default prefork pool, -E): its no-op round"
    )
    print("    trip and its three-hop chain across two workers, interleaved run by run")
    if args.trace:
        trace_one_handoff(bench, args.trace_latency)
    labels = list(VARIANTS)
    ratios: dict[str, list[float]] = {label: [] for label in labels}
    cpu_ratios: dict[str, list[float]] = {label: [] for label in labels}
    for rep in range(args.repeats):
        print(f"    {load()}")
        chain_variants = [v.strip() for v in args.chain_variants.split(",") if v.strip()]
        figure = round_trips(bench, args.round_trips, args.warmup, labels, chain_variants)
        m_base = _median(figure["base"])
        m_chain = _median(figure["chain"])
        print(
            f"    rep {rep + 1} stock Celery: no-op median {m_base * 1000:6.2f} ms; three-hop chain median "
            f"{m_chain * 1000:6.2f} ms ({m_chain / m_base:4.2f}x the no-op), its two workers' CPU "
            f"{figure['chain_cpu'] * 1000:5.2f} ms per chain",
            flush=True,
        )
        for label, (times, cpu) in figure["chain_variants"].items():
            m = _median(times)
            print(
                f"    rep {rep + 1} stock chain, {label:10s}: median {m * 1000:6.2f} ms = {m / m_chain:4.2f}x "
                f"the stock chain; CPU {cpu * 1000:5.2f} ms per chain = {cpu / figure['chain_cpu']:4.2f}x",
                flush=True,
            )
        for label in labels:
            m = _median(figure["times"][label])
            ratio = m / m_chain
            cpu = figure["cpu"][label]
            cpu_ratio = cpu / figure["chain_cpu"]
            ratios[label].append(ratio)
            cpu_ratios[label].append(cpu_ratio)
            rt = figure["round_trips"][label]
            print(
                f"    rep {rep + 1} {label} median {m * 1000:7.2f} ms = {ratio:4.2f}x the chain "
                f"({m / m_base:4.2f}x the no-op); lead + member worker CPU {cpu * 1000:5.2f} ms per handoff "
                f"= {cpu_ratio:4.2f}x the chain's; worker-side Redis round trips per handoff: "
                f"{rt['async']:.1f} runtime + {rt['sync']:.1f} celery/kombu",
                flush=True,
            )
        print(
            f"    rep {rep + 1} {figure['commands']:.0f} Redis commands per handoff (all clients, Lua-internal included)"
        )
    for label in labels:
        r, c = ratios[label], cpu_ratios[label]
        print(f"    {label}/chain latency median {_median(r):.2f}x (spread {min(r):.2f}-{max(r):.2f}, {len(r)} reps; "
              f"target <= 1.6x: {'met' if _median(r) <= 1.6 else 'NOT met'})")  # fmt: skip
        print(f"    {label}/chain worker CPU median {_median(c):.2f}x (spread {min(c):.2f}-{max(c):.2f}; "
              f"target <= 1.4x: {'met' if _median(c) <= 1.4 else 'NOT met'})")  # fmt: skip


def _paired(sides: list[Deployment], args: argparse.Namespace) -> None:
    """Round trips on every side, alternating their order run by run (warm-up ones not kept)."""
    for side in sides:
        side.ready()
    for i in range(args.warmup + args.round_trips):
        for side in sides if i % 2 == 0 else sides[::-1]:
            elapsed = side.handoff(f"task {i}")
            if i >= args.warmup:
                side.times.append(elapsed)


def figure_d(bench: Bench, args: argparse.Namespace) -> None:
    print()
    print(
        "(d) the tool journal: handoff round trip whose member calls one (journaled) tool, with the journal"
    )
    print("    beside a deployment without it (LATTICE_TOOL_JOURNAL=0), paired run by run")
    ratios: list[float] = []
    for rep in range(args.repeats):
        print(f"    {load()}")
        sides = [
            Deployment(bench, "journal", {"LATTICE_TOOL_JOURNAL": "1"}, TOOL_TEAM_REF, "bench_tool"),
            Deployment(bench, "nojournal", {"LATTICE_TOOL_JOURNAL": "0"}, TOOL_TEAM_REF, "bench_tool"),
        ]
        try:
            _paired(sides, args)
        finally:
            for side in sides:
                side.close()
            bench.stop_all()
        with_journal, without = (_median(side.times) for side in sides)
        ratios.append(with_journal / without)
        print(f"    rep {rep + 1}  with the journal median {with_journal * 1000:7.2f} ms   without (base) median "
              f"{without * 1000:7.2f} ms   ratio {ratios[-1]:.2f}x", flush=True)  # fmt: skip
    verdict = "met" if _median(ratios) <= 1.25 else "NOT met"
    print(f"    ratio median {_median(ratios):.2f}x (spread {min(ratios):.2f}-{max(ratios):.2f}; "
          f"target <= 1.25x: {verdict})")  # fmt: skip


def figure_r(bench: Bench, args: argparse.Namespace) -> None:
    """(r) the handoff round trip with RabbitMQ as the broker beside Redis, paired run by run."""
    from kombu import Connection

    print()
    print(
        f"(r) handoff round trip, broker RabbitMQ ({args.amqp_url.split('@')[-1]}, quorum queues; mailboxes,"
    )
    print("    runs and registry on the bench's Redis) beside broker Redis, paired run by run")
    ratios: list[float] = []
    for rep in range(args.repeats):
        print(f"    {load()}")
        redis_side = Deployment(bench, "redis", {})
        amqp_side = Deployment(
            bench, "amqp", {"LATTICE_BROKER_URL": args.amqp_url, "LATTICE_MAILBOX_URL": bench.broker}
        )
        amqp_side.broker, amqp_side.mailbox_url = args.amqp_url, bench.broker
        sides = [redis_side, amqp_side]
        try:
            _paired(sides, args)
        finally:
            for side in sides:
                side.close()
            bench.stop_all()
            with Connection(args.amqp_url) as conn:  # the quorum queues outlive the workers
                for member in ("lead", "echo", "default"):
                    channel = conn.channel()
                    with contextlib.suppress(Exception):
                        queue = f"{amqp_side.prefix}.{'bench.' if member != 'default' else ''}{member}"
                        channel.queue_delete(queue=queue)
                    with contextlib.suppress(Exception):
                        channel.close()
        on_redis, on_amqp = (_median(side.times) for side in sides)
        ratios.append(on_amqp / on_redis)
        print(f"    rep {rep + 1}  broker Redis median {on_redis * 1000:7.2f} ms   broker RabbitMQ median "
              f"{on_amqp * 1000:7.2f} ms   ratio RabbitMQ/Redis {ratios[-1]:.2f}x", flush=True)  # fmt: skip
    print(f"    ratio median {_median(ratios):.2f}x (spread {min(ratios):.2f}-{max(ratios):.2f})")


# --------------------------------------------------------------------------- (b) many calls in flight


def in_flight(
    bench: Bench, runs: int, latency: float, worker_args: list[str], env: dict[str, str]
) -> dict[str, Any]:
    """Runs/s of ``runs`` runs on ONE worker process, and its peak resident memory."""
    from lattice_client import LatticeClient

    proc = bench.lattice_worker(*worker_args, latency=latency, env=env)
    proc.wait_ready()
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    try:
        client.submit("bench", "warm-up").wait(timeout=120)
        cpu0 = proc.cpu_seconds()
        t0 = time.perf_counter()
        handles = [client.submit("bench", f"run {i}") for i in range(runs)]
        submitted = time.perf_counter() - t0
        for handle in handles:
            result = handle.wait(timeout=1200)
            if result.result != "answer: echoed":
                raise RuntimeError(f"unexpected result {result}")
        elapsed = time.perf_counter() - t0
        cpu = proc.cpu_seconds() - cpu0
        rss = proc.peak_rss_mb()
    finally:
        client.close()
        bench.stop_all()
    return {"rate": runs / elapsed, "elapsed": elapsed, "rss": rss, "submitted": submitted, "cpu": cpu}


def stock_throughput(bench: Bench, tasks: int, pool_args: list[str]) -> dict[str, Any]:
    """A **stock** Celery worker (:func:`~distributed_teams.make_noop_app`: ``Celery(name,
    broker, backend)``, Celery's defaults and ``-E``, ``pool_args``) draining ``tasks``
    no-op tasks sent at once: tasks/s and the worker's CPU (its pool processes
    included) per task, from the first send to the last result."""
    from distributed_teams import NOOP_QUEUE_SUFFIX, make_noop_app

    proc = bench.noop_worker(*pool_args)
    proc.wait_ready()
    queue = f"{bench.prefix}.{NOOP_QUEUE_SUFFIX}"
    sender = make_noop_app()  # built now: the module-level app predates the bench's key prefix
    try:
        for _ in range(5):
            sender.send_task("bench.noop", queue=queue).get(timeout=60)
        cpu0 = proc.cpu_seconds()
        t0 = time.perf_counter()
        results = [sender.send_task("bench.noop", queue=queue) for _ in range(tasks)]
        for result in results:
            if result.get(timeout=600) != "ok":
                raise RuntimeError("a stock no-op did not answer ok")
        elapsed = time.perf_counter() - t0
        cpu = proc.cpu_seconds() - cpu0
    finally:
        sender.close()
        bench.stop_all()
    return {"rate": tasks / elapsed, "cpu_per_task": cpu / tasks, "cpu_share": cpu / elapsed}


STOCK_POOLS: dict[str, list[str]] = {
    "solo": ["--pool", "solo"],
    "prefork x 1": ["--pool", "prefork", "--concurrency", "1"],
}
"""The stock no-op baselines of (b): label -> the stock worker's pool options
(``solo``: Celery's one-process floor, the task in the consumer's own thread)."""


def figure_b(bench: Bench, args: argparse.Namespace) -> None:
    print()
    print(
        f"(b) many calls in flight: {args.latency_b:.1f} s per model call, 3 calls per run, "
        "ONE worker process consuming every queue"
    )
    setups: list[tuple[str, int, list[str], dict[str, str], int]] = [
        (
            "asyncio (default)",
            args.concurrency_b,
            ["--concurrency", str(args.concurrency_b)],
            {},
            args.runs_b,
        ),
    ]
    for variant in (v.strip() for v in args.variants.split(",") if v.strip()):
        kind, _, size = variant.partition("@")
        n = int(size or args.concurrency_b)
        if kind in ("asyncio", "threads"):
            setups.append((kind, n, ["--pool", kind, "--concurrency", str(n)], {}, max(args.runs_b, 5 * n)))
        elif kind == "stock-transport":
            setups.append(("asyncio, kombu's transport", n, ["--concurrency", str(n)], {STOCK_TRANSPORT_ENV: "1"},
                           args.runs_b))  # fmt: skip
        else:
            raise SystemExit(f"unknown variant {variant!r} (asyncio@N, threads@N, stock-transport@N)")
    p = args.prefork_concurrency
    setups.append(
        ("prefork", p, ["--pool", "prefork", "--concurrency", str(p)], {}, args.prefork_runs or 6 * p)
    )
    for repeat in range(args.repeats_b):
        floors: dict[str, float] = {}
        for stock_label, pool_args in STOCK_POOLS.items():
            print(f"    {load()}", flush=True)
            stock = stock_throughput(bench, args.stock_tasks_b, pool_args)
            floors[stock_label] = stock["cpu_per_task"]
            print(
                f"    rep {repeat + 1} STOCK Celery no-op, {stock_label:11s}: {args.stock_tasks_b} tasks sent at once, "
                f"{stock['rate']:6.1f} tasks/s at {stock['cpu_share'] * 100:3.0f}% of a CPU, worker CPU "
                f"{stock['cpu_per_task'] * 1000:.2f} ms per task (one CPU: at most {1 / stock['cpu_per_task']:4.0f} "
                f"tasks/s)",
                flush=True,
            )
        floor = floors["solo"]
        budget = args.latency_b / args.concurrency_b  # CPU seconds per step at 100% of one CPU
        print(
            f"    {args.concurrency_b} calls of {args.latency_b:.1f} s in flight = "
            f"{args.concurrency_b / args.latency_b:.0f} steps/s: one process (one CPU) has {budget * 1000:.2f} ms "
            f"of CPU per step at most; stock Celery's own floor (solo) is {floor * 1000:.2f} ms per task = "
            f"{floor / budget:.2f}x that budget (one Celery task per step: "
            f"{'reachable' if floor < 0.9 * budget else 'NOT reachable on one process'})",
            flush=True,
        )
        for label, n, worker_args, env, runs in setups:
            print(f"    {load()}", flush=True)
            figure = in_flight(bench, runs, args.latency_b, worker_args, env)
            ideal = n / (3 * args.latency_b)
            fraction = figure["rate"] / ideal
            target = "" if label.startswith("prefork") else (
                f"  (target >= 0.9: {'met' if fraction >= 0.9 and n >= 200 else 'NOT met'})"
            )  # fmt: skip
            print(
                f"    rep {repeat + 1} {label:22s} x {n:4d}: {runs:5d} runs in {figure['elapsed']:6.1f} s = "
                f"{figure['rate']:6.2f} runs/s, ideal {ideal:6.2f} -> {fraction:.2f} of ideal; peak RSS "
                f"{figure['rss']:6.0f} MiB ({figure['rss'] / n:.2f} MiB per call in flight); worker CPU "
                f"{figure['cpu']:.1f} s = {figure['cpu'] / figure['elapsed'] * 100:.0f}% of a CPU, "
                f"{figure['cpu'] / (3 * runs) * 1000:.1f} ms per step = {figure['cpu'] / (3 * runs) / floor:.1f}x "
                f"the stock no-op's; submits took {figure['submitted']:.1f} s{target}",
                flush=True,
            )


# --------------------------------------------------------------------------- (c) scaling


def throughput(bench: Bench, workers: int, runs: int, latency: float) -> float:
    from lattice_client import LatticeClient

    procs = [bench.lattice_worker("--concurrency", "1", latency=latency) for _ in range(workers)]
    for proc in procs:
        proc.wait_ready()
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    try:
        client.submit("bench", "warm-up").wait(timeout=60)
        elapsed = run_batch(client, runs)
    finally:
        client.close()
        bench.stop_all()
    return runs / elapsed


def figure_c(bench: Bench, args: argparse.Namespace) -> None:
    counts = [int(x) for x in args.workers.split(",") if x.strip()]
    print()
    print(f"(c) scaling: {args.runs_c} runs, {args.latency_c * 1000:.0f} ms per model call (3 calls per run), "
          "worker processes with --concurrency 1")  # fmt: skip
    for repeat in range(args.repeats_c):
        print(f"    {load()}")
        rates: dict[int, float] = {}
        for n in counts:
            rates[n] = throughput(bench, n, args.runs_c, args.latency_c)
            line = f"    rep {repeat + 1} {n} worker process(es): {rates[n]:7.2f} runs/s"
            if n != counts[0]:
                factor = rates[n] / (n * rates[counts[0]] / counts[0])
                line += f"   scaling {factor:.2f} of linear (target >= 0.8: {'met' if factor >= 0.8 else 'NOT met'})"
            else:
                line += "   (baseline)"
            print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--figures",
        default="a,d,b,c",
        help="which figures (default a,d,b,c; r: RabbitMQ, o: one Redis's ceiling)",
    )
    parser.add_argument(
        "--amqp-url", default="amqp://guest:guest@127.0.0.1:5672//", help="(r) the RabbitMQ broker"
    )
    parser.add_argument(
        "--broker-url", default=None, help="use this Redis (default: start a private redis-server)"
    )
    parser.add_argument("--round-trips", type=int, default=100, help="(a) measured round trips per rep (100)")
    parser.add_argument("--warmup", type=int, default=5, help="(a) warm-up round trips (5)")
    parser.add_argument("--repeats", type=int, default=3, help="(a) repetitions (3)")
    parser.add_argument(
        "--held-compare", action="store_true", help="(a) also with plain evalsha, interleaved"
    )
    parser.add_argument(
        "--chain-variants",
        default="",
        help="(a) stock chains beside the stock one: no-events,acks-late,prefetch-1,results",
    )
    parser.add_argument("--trace", action="store_true", help="(a) print the Redis requests of one handoff")
    parser.add_argument(
        "--trace-latency", type=float, default=0.0, help="(a) --trace: seconds per model call (0)"
    )
    parser.add_argument("--runs-b", type=int, default=1000, help="(b) runs (1000)")
    parser.add_argument("--latency-b", type=float, default=2.0, help="(b) seconds per model call (2.0)")
    parser.add_argument(
        "--concurrency-b", type=int, default=200, help="(b) steps in flight on the default pool (200)"
    )
    parser.add_argument(
        "--variants", default="", help="(b) more set-ups, e.g. threads@200,asyncio@400,stock-transport@200"
    )
    parser.add_argument(
        "--stock-tasks-b", type=int, default=3000, help="(b) stock no-op tasks of the baseline (3000)"
    )
    parser.add_argument("--prefork-concurrency", type=int, default=8, help="(b) prefork processes (8)")
    parser.add_argument("--prefork-runs", type=int, default=0, help="(b) prefork runs (6 x processes)")
    parser.add_argument("--repeats-b", type=int, default=1, help="(b) repetitions (1)")
    parser.add_argument("--runs-c", type=int, default=200, help="(c) runs per measurement (200)")
    parser.add_argument("--latency-c", type=float, default=0.1, help="(c) seconds per model call (0.1)")
    parser.add_argument("--workers", default="1,2,4", help="(c) worker process counts (1,2,4)")
    parser.add_argument("--repeats-c", type=int, default=1, help="(c) repetitions (1)")
    parser.add_argument("--runs-o", type=int, default=400, help="(o) handoffs per batch (400)")
    parser.add_argument("--workers-o", type=int, default=2, help="(o) worker processes (2)")
    parser.add_argument("--repeats-o", type=int, default=3, help="(o) repetitions (3)")
    args = parser.parse_args(argv)
    figures = {f.strip() for f in args.figures.split(",")}

    bench = Bench(args.broker_url)
    print(f"key prefix {bench.prefix}; broker {bench.broker}; worker logs in {bench.logs}; {load()}")
    try:
        if "a" in figures:
            figure_a(bench, args)
        if "d" in figures:
            figure_d(bench, args)
        if "r" in figures:
            figure_r(bench, args)
        if "b" in figures:
            figure_b(bench, args)
        if "c" in figures:
            figure_c(bench, args)
        if "o" in figures:
            figure_o(bench, args, load)
    finally:
        bench.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
