"""The distributed runtime on real worker processes, each figure beside a baseline from the same run.

1. **Handoff round trip** (issue 6: target <= 2.5x). One run = submit ->
   the lead hands off to one member -> the member replies -> the lead answers
   -> the client gets the final result (``RunHandle.wait``): three Celery tasks
   (``run_lead``, ``deliver``, ``resume_lead``) with zero-latency scripted
   models. Baseline: a Celery no-op task round trip on the same broker
   (``noop.delay().get()`` with the Redis result backend). Both are measured
   sequentially against one worker process (``--concurrency 1``), interleaved
   run by run after a warm-up; printed as medians in milliseconds and the
   ratio handoff / no-op.
2. **The tool journal's cost** (target <= 1.25x). The same handoff round trip
   with a member that calls one tool (unguarded, so journaled: recorded
   ``started`` before the handler, ``completed`` after, its history persisted
   per work item; ``docs/tool-effects.md``) before replying, on a worker with
   the journal (the default) beside one without it (``LATTICE_TOOL_JOURNAL=0``),
   each under its own key prefix, interleaved run by run. Printed: medians and
   the ratio journaled / not journaled.
3. **Throughput scaling** (target >= 0.8 of linear). 200 independent runs of
   the same team, every model call sleeping 100 ms (simulated model latency),
   all submitted at once, on 1, 2 and 4 worker processes (``lattice worker``,
   ``--concurrency 1`` each). Printed: runs per second for each and the
   scaling factor ``throughput(N) / (N * throughput(1))``.

Everything runs under a fresh key prefix on the Redis at ``LATTICE_BROKER_URL``
(default ``redis://127.0.0.1:6379/0``); its keys are deleted at the end. The
workers are subprocesses in their own process groups, stopped by group id.

Run: ``python bench/distributed.py [--round-trips N] [--runs N] [--latency S] [--workers 1,2,4]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from celery import Celery

from lattice_client.celery_config import make_celery_app
from lattice_client.settings import get_settings
from lattice_worker import AssistantModelMessage, ScriptedModelClient, define_agent, tool
from lattice_worker.team import create_team, team_member
from lattice_worker.team.reports import parse_report_message

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TEAM_REF = "distributed:bench_team"
NOOP_QUEUE_SUFFIX = "bench.noop"

# --------------------------------------------------------------------------- the team (imported by the workers)


async def _latency() -> None:
    seconds = float(os.environ.get("BENCH_MODEL_LATENCY", "0") or 0)
    if seconds > 0:
        await asyncio.sleep(seconds)


def _tool_use(name: str, data: dict[str, Any], tid: str) -> AssistantModelMessage:
    return AssistantModelMessage(
        content=[{"type": "tool_use", "id": tid, "name": name, "input": data}], stop_reason="tool_use"
    )


async def lead_model(request: Any) -> AssistantModelMessage:
    """Hand the prompt to ``echo``; answer with its report."""
    await _latency()
    for message in reversed(request.messages):
        entries = parse_report_message(message)
        if entries:
            return AssistantModelMessage(
                content=[{"type": "text", "text": f"answer: {entries[0]['content']}"}], stop_reason="end_turn"
            )
    prompt = request.messages[0]["content"]
    return _tool_use("echo", {"mode": "handoff", "task": str(prompt)}, "toolu_handoff")


async def echo_model(request: Any) -> AssistantModelMessage:
    """Reply to the task at once (``team_reply`` ends the member's turn)."""
    await _latency()
    return _tool_use("team_reply", {"content": "echoed"}, "toolu_reply")


bench_team = create_team(
    name="bench",
    lead=define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=4),
    members=[
        team_member(
            name="echo", agent=define_agent(name="echo", model_client=ScriptedModelClient(echo_model))
        )
    ],
)


async def scribe_model(request: Any) -> AssistantModelMessage:
    """Call ``note`` once, then reply with its result."""
    await _latency()
    if len(request.messages) == 1:
        return _tool_use("note", {"text": "x"}, "toolu_note")
    return _tool_use("team_reply", {"content": "echoed"}, "toolu_reply")


@tool
def note(text: str) -> str:
    """Take a note (an unguarded tool: the journal records it)."""
    return f"noted {text}"


bench_tool_team = create_team(
    name="bench_tool",
    lead=define_agent(name="lead", model_client=ScriptedModelClient(lead_model), max_turns=4),
    members=[
        team_member(
            name="echo",
            agent=define_agent(name="scribe", model_client=ScriptedModelClient(scribe_model), tools=[note]),
        )
    ],
)
TOOL_TEAM_REF = "distributed:bench_tool_team"

# --------------------------------------------------------------------------- the baseline (a Celery no-op)


def _noop_app() -> Celery:
    settings = get_settings()
    app = make_celery_app(settings, name="bench-noop")
    app.conf.result_backend = settings.broker_url
    app.conf.task_ignore_result = False
    return app


noop_app = _noop_app()


@noop_app.task(name="bench.noop", ignore_result=False, shared=False)
def noop() -> str:
    return "ok"


# --------------------------------------------------------------------------- processes


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115
        self.log_path = log
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log_path.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


class Bench:
    def __init__(self) -> None:
        self.prefix = f"bench-{uuid.uuid4().hex[:10]}"
        self.broker = os.environ.get("LATTICE_BROKER_URL", "redis://127.0.0.1:6379/0")
        self.logs = Path(tempfile.mkdtemp(prefix="lattice-bench-"))
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LATTICE_", "ANTHROPIC_", "DEEPSEEK_"))
        }
        self.env.update(
            {
                "LATTICE_BROKER_URL": self.broker,
                "LATTICE_KEY_PREFIX": self.prefix,
                "LATTICE_REAPER": "0",
                "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        os.environ["LATTICE_KEY_PREFIX"] = self.prefix
        os.environ["LATTICE_BROKER_URL"] = self.broker
        self.procs: list[Proc] = []
        self.started = 0
        self.extra_prefixes: list[str] = []

    def start(self, argv: list[str], latency: float = 0.0, env: dict[str, str] | None = None) -> Proc:
        env = {**self.env, "BENCH_MODEL_LATENCY": str(latency), **(env or {})}
        self.started += 1
        proc = Proc(argv, env, self.logs / f"p{self.started}.log")
        self.procs.append(proc)
        return proc

    def lattice_worker(
        self, latency: float, team_ref: str = TEAM_REF, env: dict[str, str] | None = None
    ) -> Proc:
        lattice = str(Path(sys.executable).with_name("lattice"))
        return self.start(
            [
                lattice,
                "worker",
                team_ref,
                "--concurrency",
                "1",
                "--without-mingle",
                "--without-gossip",
                "-l",
                "INFO",
            ],
            latency,
            env,
        )

    def noop_worker(self) -> Proc:
        queue = f"{self.prefix}.{NOOP_QUEUE_SUFFIX}"
        return self.start(
            [sys.executable, "-m", "celery", "-A", "distributed:noop_app", "worker", "-Q", queue, "--concurrency", "1",
             "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"noop.{self.prefix}@%h"]
        )  # fmt: skip

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs.clear()

    def cleanup(self) -> None:
        import redis

        self.stop_all()
        client = redis.Redis.from_url(self.broker)
        try:
            keys = []
            for prefix in [self.prefix, *self.extra_prefixes]:
                keys += list(client.scan_iter(match=f"{prefix}:*", count=1000))
            keys += list(client.scan_iter(match="celery-task-meta-*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        finally:
            client.close()


# --------------------------------------------------------------------------- measurements


def round_trips(bench: Bench, count: int, warmup: int) -> tuple[list[float], list[float]]:
    from lattice_client import LatticeClient

    lattice = bench.lattice_worker(0.0)
    noop_proc = bench.noop_worker()
    lattice.wait_ready()
    noop_proc.wait_ready()
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    queue = f"{bench.prefix}.{NOOP_QUEUE_SUFFIX}"
    sender = _noop_app()  # built now: the module-level app predates the bench's key prefix
    ours: list[float] = []
    base: list[float] = []
    try:
        for i in range(warmup + count):
            t0 = time.perf_counter()
            result = client.submit(TEAM_REF, f"task {i}").wait(timeout=30)
            t1 = time.perf_counter()
            if result.result != "answer: echoed":
                raise RuntimeError(f"unexpected result {result}")
            assert sender.send_task("bench.noop", queue=queue).get(timeout=30) == "ok"
            t2 = time.perf_counter()
            if i >= warmup:
                ours.append(t1 - t0)
                base.append(t2 - t1)
    finally:
        client.close()
        sender.close()
        bench.stop_all()
    return ours, base


def journal_round_trips(bench: Bench, count: int, warmup: int) -> tuple[list[float], list[float]]:
    """Handoff round trips of the tool team with the journal (``bench``'s prefix)
    and without it (a second prefix), interleaved run by run."""
    from lattice_client import LatticeClient

    other = f"{bench.prefix}-nojournal"
    journaled = bench.lattice_worker(0.0, TOOL_TEAM_REF, {"LATTICE_TOOL_JOURNAL": "1"})
    plain = bench.lattice_worker(
        0.0, TOOL_TEAM_REF, {"LATTICE_TOOL_JOURNAL": "0", "LATTICE_KEY_PREFIX": other}
    )
    journaled.wait_ready()
    plain.wait_ready()
    clients = [
        LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix),
        LatticeClient(broker_url=bench.broker, key_prefix=other),
    ]
    times: list[list[float]] = [[], []]
    try:
        for i in range(warmup + count):
            for side, client in enumerate(clients):
                t0 = time.perf_counter()
                result = client.submit(TOOL_TEAM_REF, f"task {i}").wait(timeout=30)
                elapsed = time.perf_counter() - t0
                if result.result != "answer: echoed":
                    raise RuntimeError(f"unexpected result {result}")
                if i >= warmup:
                    times[side].append(elapsed)
    finally:
        for client in clients:
            client.close()
        bench.stop_all()
        bench.extra_prefixes.append(other)
    return times[0], times[1]


def throughput(bench: Bench, workers: int, runs: int, latency: float) -> float:
    from lattice_client import LatticeClient

    procs = [bench.lattice_worker(latency) for _ in range(workers)]
    for proc in procs:
        proc.wait_ready()
    client = LatticeClient(broker_url=bench.broker, key_prefix=bench.prefix)
    try:
        client.submit(TEAM_REF, "warm-up").wait(timeout=60)
        t0 = time.perf_counter()
        handles = [client.submit(TEAM_REF, f"run {i}") for i in range(runs)]
        for handle in handles:
            result = handle.wait(timeout=600)
            if result.result != "answer: echoed":
                raise RuntimeError(f"unexpected result {result}")
        elapsed = time.perf_counter() - t0
    finally:
        client.close()
        bench.stop_all()
    return runs / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--round-trips", type=int, default=100, help="measured handoff round trips (default 100)"
    )
    parser.add_argument("--warmup", type=int, default=5, help="warm-up round trips (default 5)")
    parser.add_argument("--runs", type=int, default=200, help="runs per throughput measurement (default 200)")
    parser.add_argument(
        "--latency", type=float, default=0.1, help="simulated model latency, seconds (default 0.1)"
    )
    parser.add_argument("--workers", default="1,2,4", help="worker process counts (default 1,2,4)")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.workers.split(",") if x.strip()]

    bench = Bench()
    print(f"key prefix {bench.prefix}; broker {bench.broker}; worker logs in {bench.logs}")
    try:
        ours, base = round_trips(bench, args.round_trips, args.warmup)
        m_ours, m_base = statistics.median(ours), statistics.median(base)
        print()
        print("1. handoff round trip (submit -> member -> reply -> final result), one worker process")
        print(f"   handoff run           median {m_ours * 1000:8.2f} ms   p90 {_p90(ours) * 1000:8.2f} ms")
        print(f"   celery no-op (base)   median {m_base * 1000:8.2f} ms   p90 {_p90(base) * 1000:8.2f} ms")
        ratio = m_ours / m_base
        print(
            f"   ratio handoff / no-op: {ratio:.2f}x   (target <= 2.5x: {'met' if ratio <= 2.5 else 'NOT met'})"
        )

        print()
        with_journal, without = journal_round_trips(bench, args.round_trips, args.warmup)
        m_with, m_without = statistics.median(with_journal), statistics.median(without)
        print("2. the tool journal: handoff round trip whose member calls one (journaled) tool")
        print(
            f"   with the journal      median {m_with * 1000:8.2f} ms   p90 {_p90(with_journal) * 1000:8.2f} ms"
        )
        print(
            f"   without (base)        median {m_without * 1000:8.2f} ms   p90 {_p90(without) * 1000:8.2f} ms"
        )
        ratio = m_with / m_without
        print(
            f"   ratio journaled / not: {ratio:.2f}x   (target <= 1.25x: {'met' if ratio <= 1.25 else 'NOT met'})"
        )

        print()
        print(
            f"3. throughput: {args.runs} runs, {args.latency * 1000:.0f} ms per model call (3 calls per run)"
        )
        rates: dict[int, float] = {}
        for n in counts:
            rates[n] = throughput(bench, n, args.runs, args.latency)
            line = f"   {n} worker process(es): {rates[n]:7.2f} runs/s"
            if counts[0] in rates and n != counts[0]:
                base_rate = rates[counts[0]] / counts[0]
                factor = rates[n] / (n * base_rate)
                line += f"   scaling factor {factor:.2f} of linear (target >= 0.8: {'met' if factor >= 0.8 else 'NOT met'})"
            else:
                line += "   (baseline)"
            print(line, flush=True)
    finally:
        bench.cleanup()
    return 0


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


if __name__ == "__main__":
    sys.exit(main())
