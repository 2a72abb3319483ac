"""Errors raised by the thin client and the run store.

Both are standard-library exception subclasses, so callers that do not import
this module can still catch them (``LookupError`` / ``ValueError``).
"""

from __future__ import annotations

import traceback


class RunNotFoundError(LookupError):
    """No run with this id exists (under this key prefix)."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} not found")
        self.run_id = run_id


class RunStateError(ValueError):
    """The run is not in a status that allows the operation (for example
    suspending a run that is not ``running``). ``status`` is its current status."""

    def __init__(self, run_id: str, status: str, operation: str) -> None:
        super().__init__(f"cannot {operation} run {run_id!r}: its status is {status!r}")
        self.run_id = run_id
        self.status = status


class RunLeaseLostError(RunStateError):
    """A lead segment's write was refused: its lease token no longer holds the
    run (the lease expired and the reaper took the run over, or the run was
    cancelled or finished meanwhile). The worker must stop the segment and
    write nothing more; the run continues (or ended) elsewhere."""

    def __init__(self, run_id: str, operation: str) -> None:
        ValueError.__init__(self, f"cannot {operation} run {run_id!r}: this worker's lead lease was lost")
        self.run_id = run_id
        self.status = "lease_lost"


class ItemClaimLostError(RunLeaseLostError):
    """A member's write to its work item's journal or history was refused: a
    later claim of the item's message (a re-claim after this worker stalled or
    died) holds it now. The worker must stop and write nothing more."""

    def __init__(self, run_id: str, work_item_id: str, operation: str) -> None:
        ValueError.__init__(
            self,
            f"cannot {operation} work item {work_item_id!r} of run {run_id!r}: a later claim of it holds it now",
        )
        self.run_id = run_id
        self.work_item_id = work_item_id
        self.status = "claim_lost"


def describe_module_error(module: str, exc: BaseException) -> str:
    """One line for an exception raised while importing (or calling into) a
    user's team module: the module, where it was raised (file and line) and
    the exception, e.g. ``error in team module 'myteam' (raised at
    /srv/myteam.py, line 12): ZeroDivisionError: division by zero``. Used by
    the client and the workers alike; raise it ``from exc`` so the traceback
    stays available (``lattice --debug`` prints it)."""
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f" (in {exc.filename}, line {exc.lineno})"
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        if frames:
            where = f" (raised at {frames[-1].filename}, line {frames[-1].lineno})"
    return f"error in team module {module!r}{where}: {type(exc).__name__}: {exc}"


__all__ = [
    "ItemClaimLostError",
    "RunLeaseLostError",
    "RunNotFoundError",
    "RunStateError",
    "describe_module_error",
]
