"""The distributed runtime on real worker processes, each figure beside a baseline from the same run.

(a) **Handoff round trip** (target <= 3.0x). One run = submit -> the lead
    hands off to one member -> the member replies -> the lead answers -> the
    client has the final result (``RunHandle.wait``): three Celery tasks
    (``run_lead``, ``deliver``, ``resume_lead``), zero-latency scripted models,
    the lead and the member on SEPARATE ``lattice worker`` processes (the
    README's layout: ``--member lead`` and ``--member echo``, default pool).
    Baseline: a Celery no-op task round trip on the same broker
    (``send_task(...).get()``, Redis result backend), its worker on the same
    pool, task events on for both (the steps the workers send each other carry
    no task-sent event, as deployed: ``lattice_worker.runtime.celery_app``;
    the client's ``run_lead`` and the no-op do). Measured sequentially, interleaved run by
    run after a warm-up; medians in milliseconds and the ratio. Also printed:
    the worker-side Redis round trips per handoff (every request a worker
    process writes to Redis -- a pipeline is one -- counted in the workers by
    this module's instrumentation, split into the runtime's own asyncio
    clients and Celery/kombu's blocking ones) and the commands per handoff
    (``INFO commandstats`` deltas of the bench's own Redis, client included).
    ``--trace``: first the Redis requests of one handoff, both workers' in time
    order (ms since the submit; a script call shows its first key's tag),
    ``--trace-latency`` seconds per model call.
(b) **Many calls in flight** (target >= 0.9 of ideal with >= 200 calls in
    flight). ``--runs-b`` runs (1,000) with ``--latency-b`` seconds (2 s) of
    model latency per call, 3 calls per run, on ONE ``lattice worker``
    process consuming every queue at its recommended settings (the default
    asyncio pool, 200 steps in flight). Ideal: ``concurrency / (3 * latency)``
    runs/s. Printed: runs/s, the fraction of ideal, the process's peak
    resident memory and CPU per step. Beside it the prefork pool
    (``--prefork-concurrency`` processes, fewer runs) and, with
    ``--variants``, other set-ups (``asyncio@N``: N steps in flight;
    ``threads@N``: Celery's threads pool with N threads; ``stock-transport@N``:
    the default pool on kombu's own Redis transport instead of
    ``lattice_client/kombu_redis.py``, which reuses one redis-py client per
    channel).
(d) **The tool journal's cost** (target <= 1.25x). The same handoff round
    trip with a member that calls one tool (unguarded, so journaled: recorded
    ``started`` before the handler, ``completed`` after, its history persisted
    per work item; ``docs/tool-effects.md``) before replying, with the journal
    (the default) beside a deployment without it (``LATTICE_TOOL_JOURNAL=0``),
    each under its own key prefix, side by side and paired run by run.
    Printed: medians and the ratio journaled / not journaled.
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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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
COUNT_DIR_ENV = "BENCH_COUNT_DIR"

# --------------------------------------------------------------------------- worker-side round-trip counting


def _install_counters(directory: str) -> None:
    """In a worker process: count every request written to Redis (one
    ``send_packed_command`` per command or pipeline) and dump the counts to
    ``<directory>/<pid>.json`` every 0.1 s."""
    import redis.asyncio.connection as aconn
    import redis.connection as sconn

    counts: dict[str, Any] = {"async": 0, "sync": 0, "trace": []}
    lock = threading.Lock()
    tracing = bool(os.environ.get("BENCH_TRACE"))

    scripts: dict[str, str] = {}  # SHA1 -> script name, for EVALSHA (filled on first use)

    def script_name(sha: str) -> str:
        if not scripts:
            import hashlib

            for folder in (REPO / "lattice_mailbox" / "lua", REPO / "lattice_client" / "runstore" / "lua"):
                for lua in folder.glob("*.lua"):
                    scripts[hashlib.sha1(lua.read_bytes()).hexdigest()] = lua.stem
        return scripts.get(sha, sha[:8])

    def names(packed: Any) -> str:
        # the command names of one request (a pipeline has several), a script call with its
        # script's name, for --trace
        data = b"".join(packed) if isinstance(packed, (list, tuple)) else bytes(packed)
        parts: list[str] = []
        pos = 0
        while pos < len(data) and data[pos : pos + 1] == b"*":  # RESP arrays of bulk strings
            end = data.index(b"\r\n", pos)
            args = []
            pos = end + 2
            for _ in range(int(data[1 + data.rfind(b"*", 0, end + 1) : end])):
                end = data.index(b"\r\n", pos)
                size = int(data[pos + 1 : end])
                args.append(data[end + 2 : end + 2 + size])
                pos = end + 4 + size
            part = args[0].decode().upper() if args else "?"
            if part == "EVAL" and len(args) > 1:
                found = re.match(rb"-- (\w+)\.lua", args[1])
                part += f"({found.group(1).decode() if found else '?'})"
            elif part == "EVALSHA" and len(args) > 1:
                part += f"({script_name(args[1].decode())})"
            parts.append(part)
        return "+".join(parts[:8]) + ("+..." if len(parts) > 8 else "")

    def note(kind: str, packed: Any) -> None:
        counts[kind] += 1
        if tracing:
            counts["trace"].append(
                f"{time.time():.6f} {kind}:{threading.current_thread().name}:{names(packed)}"
            )

    def wrap(cls: Any, kind: str, is_async: bool) -> None:
        original = cls.send_packed_command
        if is_async:

            async def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
                note(kind, command)
                return await original(self, command, *args, **kwargs)
        else:

            def counted(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                with lock:
                    note(kind, command)
                return original(self, command, *args, **kwargs)

        cls.send_packed_command = counted

    wrap(aconn.AbstractConnection, "async", True)
    wrap(sconn.AbstractConnection, "sync", False)
    path = Path(directory) / f"{os.getpid()}.json"

    def dump() -> None:
        while True:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(counts))
            tmp.replace(path)
            time.sleep(0.1)

    threading.Thread(target=dump, daemon=True, name="bench-counters").start()


if os.environ.get(COUNT_DIR_ENV):
    _install_counters(os.environ[COUNT_DIR_ENV])

STOCK_TRANSPORT_ENV = "BENCH_STOCK_TRANSPORT"
"""Set in a bench worker: kombu's own Redis transport instead of
``lattice_client.kombu_redis`` (the ``stock-transport`` variant of (b)). The
worker imports this module (its team) before it builds its Celery app."""

if os.environ.get(STOCK_TRANSPORT_ENV):
    import lattice_client.celery_config as _celery_config

    _configured = _celery_config.celery_config

    def _stock_config(settings: Any) -> dict[str, Any]:
        config = _configured(settings)
        config.pop("broker_transport", None)
        return config

    _celery_config.celery_config = _stock_config

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
    lead=define_agent(
        name="lead", model_client=ScriptedModelClient(lead_model), max_turns=4, workspace=False
    ),
    members=[
        team_member(
            name="echo",
            agent=define_agent(name="echo", model_client=ScriptedModelClient(echo_model), workspace=False),
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self._log = open(log, "wb")  # noqa: SIM115
        self.log_path = log
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log_path.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.1)
        raise RuntimeError(f"worker not ready after {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def peak_rss_mb(self) -> float:
        """Peak resident memory (VmHWM) of this process and its children, in MiB."""
        total = 0
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        total += int(line.split()[1])
        return total / 1024

    def cpu_seconds(self) -> float:
        """CPU time (user + system, seconds) used so far by this process and its children."""
        ticks = 0
        for pid in [self.proc.pid, *_children(self.proc.pid)]:
            with contextlib.suppress(OSError, IndexError, ValueError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self._log.close()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            out += [int(child), *_children(int(child))]
    return out


class Bench:
    def __init__(self, broker_url: str | None) -> None:
        self.prefix = f"bench-{uuid.uuid4().hex[:10]}"
        self.logs = Path(tempfile.mkdtemp(prefix="lattice-bench-"))
        self.redis_proc: subprocess.Popen[bytes] | None = None
        if broker_url is None:
            port = _free_port()
            self.redis_proc = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--dir", str(self.logs)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            broker_url = f"redis://127.0.0.1:{port}/0"
            self._wait_redis(broker_url)
        self.broker = broker_url
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LATTICE_", "ANTHROPIC_", "DEEPSEEK_"))
        }
        self.env.update(
            {
                "LATTICE_BROKER_URL": self.broker,
                "LATTICE_KEY_PREFIX": self.prefix,
                "LATTICE_REAPER": "0",
                "LATTICE_REGISTRY_HEARTBEAT_SECONDS": "30",
                "PYTHONPATH": f"{HERE}{os.pathsep}{REPO}",
                "PYTHONUNBUFFERED": "1",
            }
        )
        os.environ["LATTICE_KEY_PREFIX"] = self.prefix
        os.environ["LATTICE_BROKER_URL"] = self.broker
        self.procs: list[Proc] = []
        self.started = 0

    @staticmethod
    def _wait_redis(url: str) -> None:
        import redis

        client = redis.Redis.from_url(url)
        try:
            for _ in range(100):
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(f"redis-server at {url} did not start")

    def redis(self) -> Any:
        import redis

        return redis.Redis.from_url(self.broker)

    def start(self, argv: list[str], env: dict[str, str]) -> Proc:
        self.started += 1
        proc = Proc(argv, {**self.env, **env}, self.logs / f"p{self.started}.log")
        self.procs.append(proc)
        return proc

    def lattice_worker(
        self, *args: str, latency: float = 0.0, env: dict[str, str] | None = None, team_ref: str = TEAM_REF
    ) -> Proc:
        lattice = str(Path(sys.executable).with_name("lattice"))
        argv = [lattice, "worker", team_ref, *args, "--without-mingle", "--without-gossip", "-l", "INFO"]
        return self.start(argv, {"BENCH_MODEL_LATENCY": str(latency), **(env or {})})

    def noop_worker(self, *pool_args: str) -> Proc:
        queue = f"{self.prefix}.{NOOP_QUEUE_SUFFIX}"
        return self.start(
            [sys.executable, "-m", "celery", "-A", "distributed:noop_app", "worker", "-Q", queue, "-E",
             *pool_args, "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"noop.{self.prefix}@%h"],
            {},
        )  # fmt: skip

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()
        self.procs.clear()

    def cleanup(self) -> None:
        self.stop_all()
        if self.redis_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.redis_proc.pid, signal.SIGKILL)
            self.redis_proc.wait(10)
            shutil.rmtree(self.logs / "dump.rdb", ignore_errors=True)
            return
        client = self.redis()
        try:
            keys = list(
                client.scan_iter(match=f"{self.prefix}*", count=1000)
            )  # the deployments' prefixes too
            keys += list(client.scan_iter(match="celery-task-meta-*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        finally:
            client.close()


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.1f} / {five:.1f} / {fifteen:.1f} on {os.cpu_count()} CPUs"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --------------------------------------------------------------------------- (a) handoff round trip


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
    d = _Deployment(bench, "trace", {"BENCH_TRACE": "1", "BENCH_MODEL_LATENCY": str(latency)})
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


class _Deployment:
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
        self.client: Any = None
        self.times: list[float] = []

    def ready(self) -> None:
        self.lead.wait_ready()
        self.member.wait_ready()
        self.client = self.client_class(broker_url=self.broker, key_prefix=self.prefix)

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


VARIANTS: dict[str, dict[str, str]] = {"handoff": {}}
"""Deployments (label -> extra worker environment) measured side by side in (a), paired run by run."""


def round_trips(bench: Bench, count: int, warmup: int, labels: list[str]) -> dict[str, Any]:
    """One repetition of (a): every variant's deployment and the no-op worker run side by
    side; each round is one handoff per variant (in rotating order) and one no-op."""
    deployments = [_Deployment(bench, label, VARIANTS[label]) for label in labels]
    noop_proc = bench.noop_worker("--pool", "threads")
    for d in deployments:
        d.ready()
    noop_proc.wait_ready()
    queue = f"{bench.prefix}.{NOOP_QUEUE_SUFFIX}"
    sender = _noop_app()  # built now: the module-level app predates the bench's key prefix
    raw = bench.redis()
    base: list[float] = []
    try:
        for i in range(warmup):
            for d in deployments:
                d.handoff(f"warm {i}")
            sender.send_task("bench.noop", queue=queue).get(timeout=60)
        time.sleep(0.3)
        c0 = {d.label: d.counts() for d in deployments}
        for i in range(count):
            order = deployments[i % len(deployments) :] + deployments[: i % len(deployments)]
            for d in order:
                d.times.append(d.handoff(f"task {i}"))
            t0 = time.perf_counter()
            assert sender.send_task("bench.noop", queue=queue).get(timeout=60) == "ok"
            base.append(time.perf_counter() - t0)
        time.sleep(0.3)
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
        "round_trips": per,
        "commands": commands,
    }


def figure_a(bench: Bench, args: argparse.Namespace) -> None:
    print()
    print("(a) handoff round trip: submit -> lead (worker 1) -> member (worker 2) -> lead -> result;")
    print("    baseline: a Celery no-op round trip (threads pool, task events on), interleaved run by run")
    if args.trace:
        trace_one_handoff(bench, args.trace_latency)
    labels = list(VARIANTS)
    ratios: dict[str, list[float]] = {label: [] for label in labels}
    for rep in range(args.repeats):
        print(f"    {load()}")
        figure = round_trips(bench, args.round_trips, args.warmup, labels)
        m_base = _median(figure["base"])
        for label in labels:
            m = _median(figure["times"][label])
            ratio = m / m_base
            ratios[label].append(ratio)
            rt = figure["round_trips"][label]
            print(
                f"    rep {rep + 1}  handoff median {m * 1000:7.2f} ms  no-op median "
                f"{m_base * 1000:6.2f} ms  ratio {ratio:5.2f}x   worker-side Redis round trips per handoff: "
                f"{rt['async']:.1f} runtime + {rt['sync']:.1f} celery/kombu",
                flush=True,
            )
        print(
            f"    rep {rep + 1} {figure['commands']:.0f} Redis commands per handoff (all clients, Lua-internal included)"
        )
    for label in labels:
        r = ratios[label]
        verdict = "met" if _median(r) <= 3.0 else "NOT met"
        print(f"    {label} ratio median {_median(r):.2f}x (spread {min(r):.2f}-{max(r):.2f}, {len(r)} reps; "
              f"target <= 3.0x: {verdict})")  # fmt: skip


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
            _Deployment(bench, "journal", {"LATTICE_TOOL_JOURNAL": "1"}, TOOL_TEAM_REF, "bench_tool"),
            _Deployment(bench, "nojournal", {"LATTICE_TOOL_JOURNAL": "0"}, TOOL_TEAM_REF, "bench_tool"),
        ]
        try:
            for side in sides:
                side.ready()
            for i in range(args.warmup + args.round_trips):
                for side in sides if i % 2 == 0 else sides[::-1]:
                    elapsed = side.handoff(f"task {i}")
                    if i >= args.warmup:
                        side.times.append(elapsed)
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
                f"{figure['cpu'] / (3 * runs) * 1000:.1f} ms per step; submits took {figure['submitted']:.1f} s"
                f"{target}",
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
        t0 = time.perf_counter()
        handles = [client.submit("bench", f"run {i}") for i in range(runs)]
        for handle in handles:
            result = handle.wait(timeout=600)
            if result.result != "answer: echoed":
                raise RuntimeError(f"unexpected result {result}")
        elapsed = time.perf_counter() - t0
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
    parser.add_argument("--figures", default="a,d,b,c", help="which figures (default a,d,b,c)")
    parser.add_argument(
        "--broker-url", default=None, help="use this Redis (default: start a private redis-server)"
    )
    parser.add_argument("--round-trips", type=int, default=100, help="(a) measured round trips per rep (100)")
    parser.add_argument("--warmup", type=int, default=5, help="(a) warm-up round trips (5)")
    parser.add_argument("--repeats", type=int, default=3, help="(a) repetitions (3)")
    parser.add_argument(
        "--held-compare", action="store_true", help="(a) also with plain evalsha, interleaved"
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
    parser.add_argument("--prefork-concurrency", type=int, default=8, help="(b) prefork processes (8)")
    parser.add_argument("--prefork-runs", type=int, default=0, help="(b) prefork runs (6 x processes)")
    parser.add_argument("--repeats-b", type=int, default=1, help="(b) repetitions (1)")
    parser.add_argument("--runs-c", type=int, default=200, help="(c) runs per measurement (200)")
    parser.add_argument("--latency-c", type=float, default=0.1, help="(c) seconds per model call (0.1)")
    parser.add_argument("--workers", default="1,2,4", help="(c) worker process counts (1,2,4)")
    parser.add_argument("--repeats-c", type=int, default=1, help="(c) repetitions (1)")
    args = parser.parse_args(argv)
    figures = {f.strip() for f in args.figures.split(",")}

    bench = Bench(args.broker_url)
    print(f"key prefix {bench.prefix}; broker {bench.broker}; worker logs in {bench.logs}; {load()}")
    try:
        if "a" in figures:
            figure_a(bench, args)
        if "d" in figures:
            figure_d(bench, args)
        if "b" in figures:
            figure_b(bench, args)
        if "c" in figures:
            figure_c(bench, args)
    finally:
        bench.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
