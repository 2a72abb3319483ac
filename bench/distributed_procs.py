"""The processes of ``bench/distributed.py``: a private ``redis-server`` (or a key
prefix on an existing Redis), ``lattice worker`` and Celery no-op worker
subprocesses in their own process groups (started with this folder and the
repository on their ``PYTHONPATH``, stopped by group id), their peak memory and
CPU time, and the clean-up at the end.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from distributed_teams import NOOP_APP_REF, NOOP_QUEUE_SUFFIX, TEAM_REF

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


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


def run_batch(client: Any, runs: int, timeout: float = 600) -> float:
    """Submit ``runs`` runs of the bench team at once and wait for each (every
    answer checked); returns the seconds from the first submit to the last result."""
    t0 = time.perf_counter()
    handles = [client.submit("bench", f"run {i}") for i in range(runs)]
    for handle in handles:
        result = handle.wait(timeout=timeout)
        if result.result != "answer: echoed":
            raise RuntimeError(f"unexpected result {result}")
    return time.perf_counter() - t0


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

    def noop_worker(
        self, *pool_args: str, queue_suffix: str = NOOP_QUEUE_SUFFIX, events: bool = True,
        env: dict[str, str] | None = None,
    ) -> Proc:  # fmt: skip
        """A stock Celery worker of the no-op app consuming ``<prefix>.<queue_suffix>``
        (``-E`` unless ``events`` is false)."""
        queue = f"{self.prefix}.{queue_suffix}"
        return self.start(
            [sys.executable, "-m", "celery", "-A", NOOP_APP_REF, "worker", "-Q", queue, *(["-E"] if events else []),
             *pool_args, "--without-mingle", "--without-gossip", "-l", "INFO", "-n", f"{queue_suffix}.{self.prefix}@%h"],
            env or {},
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
