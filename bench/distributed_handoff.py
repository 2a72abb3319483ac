"""Figures (a) and (d) of ``bench/distributed.py``: a handoff deployment (a lead and
a member worker under their own key prefix, and a client), the interleaved
handoff / Celery no-op round trips of one repetition of (a), the workers'
Redis round-trip counts and ``--trace``.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from distributed_procs import Bench
from distributed_teams import (
    CHAIN2_QUEUE_SUFFIX,
    CHAIN_QUEUE_SUFFIX,
    COUNT_DIR_ENV,
    NOOP_QUEUE_SUFFIX,
    STOCK_CONF_ENV,
    TEAM_REF,
    WORKSPACE_ENV,
    make_noop_app,
)


def _counts(directory: Path, pids: list[int]) -> dict[str, int]:
    total = {"async": 0, "sync": 0}
    for pid in pids:
        path = directory / f"{pid}.json"
        with contextlib.suppress(OSError, ValueError):
            for key, value in json.loads(path.read_text()).items():
                if key in total:
                    total[key] += value
    return total


def trace_one_handoff(bench: Bench, latency: float = 0.0) -> None:
    """--trace: the Redis requests each worker process writes during one handoff, in
    order, with ``latency`` seconds per model call (``--trace-latency``)."""
    d = Deployment(bench, "trace", {"BENCH_TRACE": "1", "BENCH_MODEL_LATENCY": str(latency)})
    try:
        d.ready()
        d.handoff("warm")
        time.sleep(1.5)
        before = {p: _trace(d.counters, p) for p in (d.lead.proc.pid, d.member.proc.pid)}
        t_submit = time.time()
        d.handoff("traced")
        t_result = time.time()
        time.sleep(1.5)
        rows = [(t_submit, "client", "submit"), (t_result, "client", "result")]
        for label, pid in (("lead", d.lead.proc.pid), ("member", d.member.proc.pid)):
            lines = _trace(d.counters, pid)[len(before[pid]) :]
            print(f"    {label} worker: {len(lines)} requests (idle BRPOP polls included)")
            for line in lines:
                stamp, _, request = line.partition(" ")
                rows.append((float(stamp), label, request))
        rows.sort()
        start = t_submit
        print("    both workers' requests in time order (ms since the first):")
        for stamp, label, request in rows:
            print(f"      {(stamp - start) * 1000:8.2f}  {label:6s}  {request}")
    finally:
        d.close()
        bench.stop_all()


def _trace(directory: Path, pid: int) -> list[str]:
    with contextlib.suppress(OSError, ValueError):
        return list(json.loads((directory / f"{pid}.json").read_text()).get("trace", []))
    return []


def _commands(client: Any) -> int:
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for v in stats.values())


class Deployment:
    """One bench team deployment (its own key prefix): a lead and a member worker, a client."""

    def __init__(
        self, bench: Bench, label: str, env: dict[str, str], team_ref: str = TEAM_REF, team: str = "bench"
    ) -> None:
        from lattice_client import LatticeClient

        self.label = label
        self.team = team
        self.prefix = f"{bench.prefix}-{label}"
        self.counters = Path(tempfile.mkdtemp(prefix=f"counts-{label}-", dir=bench.logs))
        env = {**env, "LATTICE_KEY_PREFIX": self.prefix, COUNT_DIR_ENV: str(self.counters)}
        self.lead = bench.lattice_worker("--member", "lead", env=env, team_ref=team_ref)
        self.member = bench.lattice_worker("--member", "echo", env=env, team_ref=team_ref)
        self.client_class = LatticeClient
        self.broker = bench.broker
        self.mailbox_url: str | None = None  # the mailbox Redis when the broker is RabbitMQ
        self.client: Any = None
        self.times: list[float] = []

    def ready(self) -> None:
        self.lead.wait_ready()
        self.member.wait_ready()
        self.client = self.client_class(
            broker_url=self.broker, mailbox_url=self.mailbox_url, key_prefix=self.prefix
        )

    def handoff(self, text: str) -> float:
        t0 = time.perf_counter()
        result = self.client.submit(self.team, text).wait(timeout=60)
        elapsed = time.perf_counter() - t0
        if result.result != "answer: echoed":
            raise RuntimeError(f"unexpected result {result}")
        return elapsed

    def counts(self) -> dict[str, int]:
        return _counts(self.counters, [self.lead.proc.pid, self.member.proc.pid])

    def close(self) -> None:
        if self.client is not None:
            self.client.close()


VARIANTS: dict[str, dict[str, str]] = {"handoff": {}, "workspace": {WORKSPACE_ENV: "1"}}
"""Deployments (label -> extra worker environment) measured side by side in (a), paired run
by run: the bench team's agents without a workspace, and with one (the built-in tools of
``define_agent``'s default)."""


CHAIN_VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "no-events": ({}, False),
    "acks-late": ({"task_acks_late": True}, True),
    "prefetch-1": ({"worker_prefetch_multiplier": 1}, True),
    "results": ({"chain_results": True}, True),
}
"""Stock chain variants of (a) (``--chain-variants``): label -> (Celery settings its two
workers add, whether they send task events), each measured beside the stock chain
(``-E``, Celery's defaults): what events, late acks, prefetch 1 and stored results
cost Celery per three steps."""


class _Chain:
    """Two stock workers and the client app of one chain variant."""

    def __init__(self, bench: Bench, label: str, conf: dict[str, Any], events: bool) -> None:
        env = {STOCK_CONF_ENV: json.dumps(conf)} if conf else {}
        self.label = label
        suffixes = [f"{CHAIN_QUEUE_SUFFIX}.{label}", f"{CHAIN2_QUEUE_SUFFIX}.{label}"]
        self.procs = [bench.noop_worker(queue_suffix=s, events=events, env=env) for s in suffixes]
        self.queues = [f"{bench.prefix}.{s}" for s in suffixes]
        self.times: list[float] = []
        self.cpu0 = 0.0

    def run(self, sender: Any) -> float:
        return _chain(sender, self.queues[0], self.queues[1])


def _chain(sender: Any, first: str, second: str) -> float:
    """One Celery-only chain round trip: ``bench.chain`` on ``first`` sends the next
    hop to ``second``, which sends ``bench.noop`` back to ``first`` (the handoff's
    three steps on its two workers, no runtime); the client waits for the last
    hop's result. Seconds."""
    final_id = uuid.uuid4().hex
    t0 = time.perf_counter()
    sender.send_task("bench.chain", args=[[second, first], final_id], queue=first)
    if sender.AsyncResult(final_id).get(timeout=60) != "ok":
        raise RuntimeError("the chain's last hop did not answer ok")
    return time.perf_counter() - t0


def _cpu(procs: list[Any]) -> float:
    return sum(p.cpu_seconds() for p in procs)


def round_trips(
    bench: Bench, count: int, warmup: int, labels: list[str], chain_variants: list[str] | None = None
) -> dict[str, Any]:
    """One repetition of (a): every variant's deployment and three **stock** Celery
    workers (Celery's defaults and ``-E``: one for the no-op, two for the chain) run
    side by side; each round is one handoff per variant (in rotating order), one
    no-op and one three-hop chain across the two chain workers (the floor Celery
    alone sets for the handoff's three steps). Worker CPU is the whole round
    loop's, per handoff (the lead's and the member's worker) and per chain (the
    two chain workers, which run nothing else), idle work included for both.
    ``chain_variants``: labels of :data:`CHAIN_VARIANTS`, each chain run beside the stock one."""
    deployments = [Deployment(bench, label, VARIANTS[label]) for label in labels]
    noop_proc = bench.noop_worker()
    chain_procs = [bench.noop_worker(queue_suffix=s) for s in (CHAIN_QUEUE_SUFFIX, CHAIN2_QUEUE_SUFFIX)]
    variants = [_Chain(bench, v, *CHAIN_VARIANTS[v]) for v in chain_variants or []]
    for d in deployments:
        d.ready()
    for proc in (noop_proc, *chain_procs, *(p for v in variants for p in v.procs)):
        proc.wait_ready()
    queue = f"{bench.prefix}.{NOOP_QUEUE_SUFFIX}"
    first, second = (f"{bench.prefix}.{s}" for s in (CHAIN_QUEUE_SUFFIX, CHAIN2_QUEUE_SUFFIX))
    sender = make_noop_app()  # built now: the module-level app predates the bench's key prefix
    raw = bench.redis()
    base: list[float] = []
    chain: list[float] = []
    try:
        for i in range(warmup):
            for d in deployments:
                d.handoff(f"warm {i}")
            sender.send_task("bench.noop", queue=queue).get(timeout=60)
            _chain(sender, first, second)
            for v in variants:
                v.run(sender)
        time.sleep(0.3)
        c0 = {d.label: d.counts() for d in deployments}
        cpu0 = {d.label: _cpu([d.lead, d.member]) for d in deployments}
        chain_cpu0 = _cpu(chain_procs)
        for v in variants:
            v.cpu0 = _cpu(v.procs)
        for i in range(count):
            order = deployments[i % len(deployments) :] + deployments[: i % len(deployments)]
            for d in order:
                d.times.append(d.handoff(f"task {i}"))
            t0 = time.perf_counter()
            assert sender.send_task("bench.noop", queue=queue).get(timeout=60) == "ok"
            base.append(time.perf_counter() - t0)
            chain.append(_chain(sender, first, second))
            for v in variants:
                v.times.append(v.run(sender))
        time.sleep(0.3)
        cpu = {d.label: (_cpu([d.lead, d.member]) - cpu0[d.label]) / count for d in deployments}
        chain_cpu = (_cpu(chain_procs) - chain_cpu0) / count
        chain_variant = {v.label: (v.times, (_cpu(v.procs) - v.cpu0) / count) for v in variants}
        per = {d.label: {k: (v - c0[d.label][k]) / count for k, v in d.counts().items()} for d in deployments}
        # the commands of handoffs alone (client and workers, Lua-internal ones included)
        alone = 20
        k0 = _commands(raw)
        for i in range(alone):
            deployments[0].handoff(f"alone {i}")
        commands = (_commands(raw) - k0 - 1) / alone
    finally:
        for d in deployments:
            d.close()
        sender.close()
        raw.close()
        bench.stop_all()
    return {
        "times": {d.label: d.times for d in deployments},
        "base": base,
        "chain": chain,
        "cpu": cpu,
        "chain_cpu": chain_cpu,
        "chain_variants": chain_variant,
        "round_trips": per,
        "commands": commands,
    }
