"""Worker-side helpers for tests that drive the runtime's run-store writes directly."""

from __future__ import annotations

from typing import Any

from lattice_client.runstore import RunStore
from lattice_worker.runtime.run.context import WorkerContext
from tests.support.services import REDIS_URL, settings_for


def worker_context(prefix: str, send_task: Any = None) -> Any:
    """A bare ``WorkerContext`` over a fresh ``RunStore`` under ``prefix`` (no
    registry, no mailbox): for driving the worker's run-store writes directly.
    ``send_task``: where enqueued tasks go (default: dropped)."""
    return WorkerContext(
        settings=settings_for(prefix),
        registry=None,
        mailbox=None,
        runs=RunStore(REDIS_URL, prefix),
        send_task=send_task or (lambda *args: None),
    )
