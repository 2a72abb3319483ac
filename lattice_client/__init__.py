"""lattice_client: the thin client of the distributed runtime.

Submit team runs to Celery workers, wait for their results, stream their
events, cancel them and inspect mailboxes (docs/tutorial.md, docs/operate.md; docs/architecture.md).
This package never imports ``lattice_worker`` at module level, so a backend
service needs only the thin dependencies (celery, redis, pydantic).

Example::

    from lattice_client import LatticeClient

    with LatticeClient() as client:                     # LATTICE_* environment variables
        handle = client.submit("lattice_worker.examples.team:team", "Look through ./docs for the word lease")
        print(handle.wait(timeout=120).result)
"""

from __future__ import annotations

from .budgets import BudgetError, BudgetWait, RaisedBudget
from .celery_config import make_celery_app, queue_name
from .client import AsyncLatticeClient, AsyncRunHandle, CancelReport, LatticeClient, RunHandle, StatusReport
from .decisions import DecisionError, ParkedCall, PendingApproval
from .errors import RunNotFoundError, RunStateError
from .models import RunParent, RunRecord, RunResult, RunStatus
from .runstore import CompleteResult, RunStore
from .settings import LatticeSettings, get_settings

__all__ = [
    "BudgetError",
    "BudgetWait",
    "RaisedBudget",
    "DecisionError",
    "ParkedCall",
    "PendingApproval",
    "AsyncLatticeClient",
    "AsyncRunHandle",
    "CancelReport",
    "CompleteResult",
    "LatticeClient",
    "LatticeSettings",
    "RunHandle",
    "RunNotFoundError",
    "RunParent",
    "RunRecord",
    "RunResult",
    "RunStateError",
    "RunStatus",
    "RunStore",
    "StatusReport",
    "get_settings",
    "make_celery_app",
    "queue_name",
]
