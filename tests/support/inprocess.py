"""An in-process stand-in for a deployment: "workers" that are contexts over
their own registries, sharing one Redis key prefix, and the tasks they enqueue
collected and run by the test (``Cluster.run``). For protocol tests that need
several teams or several workers without processes."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK
from lattice_client.runstore import RunStore
from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.lead import segment as lead_segment
from lattice_worker.runtime.member import step as member_step
from lattice_worker.runtime.run.context import WorkerContext
from lattice_worker.runtime.worker.registry import TeamRegistry
from tests.support.services import REDIS_URL, settings_for


@dataclass
class Worker:
    """One stand-in worker process: a context over its own registry."""

    ctx: WorkerContext
    exporter: Any = None
    """An OpenTelemetry ``InMemorySpanExporter`` of its tracer, when the test traces."""

    def spans(self) -> list[Any]:
        return list(self.exporter.get_finished_spans()) if self.exporter is not None else []


@dataclass
class Cluster:
    """Workers under key prefix ``prefix`` and the tasks they enqueued (``sent``)."""

    prefix: str
    sent: list[tuple[str, str]] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)

    def worker(self, *teams: Any, exporter: Any = None) -> Worker:
        """A new worker serving ``teams`` (team objects, added to its own registry)."""
        settings = settings_for(self.prefix, lease_seconds=5)
        mailbox = RedisMailbox(REDIS_URL, prefix=self.prefix)
        registry = TeamRegistry(mailbox)
        for team in teams:
            registry.add(team)
        ctx = WorkerContext(
            settings=settings,
            registry=registry,
            mailbox=mailbox,
            runs=RunStore(REDIS_URL, self.prefix),
            send_task=lambda name, args, queue: self.sent.append((name, args[0])),
        )
        worker = Worker(ctx, exporter)
        self.workers.append(worker)
        return worker

    async def run(self, worker: Worker, *, only: str | None = None, limit: int = 50) -> list[str]:
        """Run the enqueued tasks (those named ``only``, when given) on ``worker``
        until none is left; returns their outcomes."""
        outcomes: list[str] = []
        for _ in range(limit):
            pending = [t for t in self.sent if only is None or t[0] == only]
            if not pending:
                return outcomes
            task = pending[0]
            self.sent.remove(task)
            name, arg = task
            body = {
                RUN_LEAD_TASK: lead_segment.run_lead,
                DELIVER_TASK: member_step.deliver,
                RESUME_LEAD_TASK: lead_segment.resume_lead,
            }[name]
            outcomes.append(await body(worker.ctx, arg))
            await worker.ctx.writer.flush()
        raise AssertionError("tasks kept coming")

    async def submit(self, worker: Worker, team: str, prompt: str) -> str:
        run_id = f"run_{uuid.uuid4().hex[:10]}"
        await worker.ctx.runs.create(run_id, team, prompt)
        self.sent.append((RUN_LEAD_TASK, run_id))
        return run_id

    async def close(self) -> None:
        """Close every worker's clients."""
        for worker in self.workers:
            await worker.ctx.writer.aclose()
            await worker.ctx.runs.aclose()
            await worker.ctx.mailbox.aclose()


__all__ = ["Cluster", "Worker"]
