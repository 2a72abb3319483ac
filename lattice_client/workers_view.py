"""What ``lattice status`` prints about the live workers: one row per queue.

Each row: the queue (``<prefix>.<team>.<member>``), how many live workers
consume it, their pool slots together (the sum of their ``--concurrency``:
how many steps of that queue can run at once) and the workers' node names
with their pool (``name (threads x 200)``). Built on the table layout of
:mod:`lattice_client.tables`; a queue's team queues that no live worker
consumes are listed with ``0`` workers when the caller names them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rich.console import RenderableType

from .registry import LiveRegistry, WorkerInfo
from .tables import Column, build_table


def worker_label(worker: WorkerInfo) -> str:
    """``node (pool x concurrency)``, e.g. ``lattice.demo.1a2b3c4d@host (threads x 200)``."""
    pool = f"{worker.pool} x {worker.concurrency}" if worker.pool else f"x {worker.concurrency}"
    return f"{worker.node} ({pool})"


def workers_table(
    title: str, workers: Sequence[WorkerInfo], width: int, expected_queues: Iterable[str] = ()
) -> RenderableType:
    """The live workers per queue (see the module doc); ``expected_queues``
    are listed even when no live worker consumes them."""
    by_queue = LiveRegistry(workers).by_queue()
    for queue in expected_queues:
        by_queue.setdefault(queue, [])
    queues = sorted(by_queue)
    columns = [
        Column("queue", queues, fold=True),
        Column("workers", [str(len(by_queue[q])) for q in queues], justify="right"),
        Column(
            "slots", [str(sum(w.concurrency for w in by_queue[q])) for q in queues], justify="right", drop=1
        ),
        Column(
            "nodes", [", ".join(worker_label(w) for w in by_queue[q]) or "-" for q in queues], flexible=True
        ),
    ]
    return build_table(title, columns, width)


__all__ = ["worker_label", "workers_table"]
