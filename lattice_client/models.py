"""Records of the distributed runtime: run status, run record, final result.

Design: docs/architecture.md, "Steps as Celery tasks" (steps 1 and 4: the final result is written to
the run record and to the run's event stream). Times are **milliseconds**
since the Unix epoch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class RunStatus(StrEnum):
    """Where a run is.

    ``queued`` (submitted, no worker started it) -> ``running`` (a lead turn runs)
    -> ``suspended`` (waiting for member work items) -> ``resuming`` (the last item
    completed; a resume task is on its way) -> ``running`` ... -> ``completed`` |
    ``failed``. ``budget_reached``: the run's token budget is spent, it is parked
    (no worker holds it) until ``raise_budget`` moves it on. ``cancelled`` can be
    reached from any non-finished status.
    ``completed``, ``failed`` and ``cancelled`` are final.
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDED = "suspended"
    RESUMING = "resuming"
    BUDGET_REACHED = "budget_reached"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        """True for ``completed``, ``failed`` and ``cancelled``."""
        return self in FINISHED_STATUSES

    @classmethod
    def parse(cls, value: RunStatus | str) -> RunStatus:
        """Accept a member or its string value; raise ``ValueError`` naming the
        valid values otherwise."""
        if isinstance(value, RunStatus):
            return value
        try:
            return cls(value)
        except ValueError:
            valid = ", ".join(s.value for s in cls)
            raise ValueError(f"unknown run status {value!r}; expected one of: {valid}") from None


FINISHED_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


class RunResult(BaseModel):
    """The final result of a run, as ``RunHandle.wait()`` returns it.

    ``status`` is ``completed``, ``failed`` or ``cancelled``. ``result`` is the
    lead's final text (``None`` when it failed or was cancelled);
    ``structured_result`` the validated structured output when the lead has an
    output schema; ``error`` a one-line description when the run did not
    complete; ``usage`` the token usage the runtime reports (a dict such as
    ``{"input_tokens": .., "output_tokens": ..}``), or ``None``.
    ``failed_work_items``: the member work items of the run that failed or were
    cancelled, one dict each (``member``, ``work_item_id``, ``status``,
    ``content``, ``error`` with its ``code`` -- ``no_reply`` for a member that
    ended without ``team_reply``); the lead saw them and decided, so a run can
    be ``completed`` with some.
    """

    model_config = ConfigDict(extra="ignore")

    run_id: str
    status: Literal["completed", "failed", "cancelled"]
    result: str | None = None
    structured_result: Any = None
    error: str | None = None
    usage: dict[str, Any] | None = None
    failed_work_items: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the run completed."""
        return self.status == "completed"

    def to_event(self) -> dict[str, Any]:
        """The ``{"type": "run_result", ...}`` event dict appended to the run's stream."""
        return {"type": "run_result", **self.model_dump(mode="json")}


class RunParent(BaseModel):
    """Where a nested team's child run reports back: the parent run and the
    mailbox message (in mailbox ``mailbox_id``) it works on."""

    run_id: str
    message_id: str
    mailbox_id: str


class RunRecord(BaseModel):
    """One run as the run store keeps it.

    ``team`` is the registered team name; ``team_ref`` the
    ``"package.module:attribute"`` reference it was submitted with, if any.
    ``created_at``/``updated_at`` are milliseconds since the epoch.
    ``max_active`` is the latest per-run bound on dispatched work items
    (``max_concurrent_work_items``), ``None`` before any item was registered.
    ``trace_carrier`` is the propagation headers of the run's trace root
    (``dict[str, str]``, ``{}`` when its tracers propagate none), written by
    the first lead segment that traced the run; ``None`` for an untraced run.
    ``budget_tokens``: the run's token budget (``None``: no budget);
    ``spent_tokens``: the tokens (input, prompt-cache reads and writes, output)
    its model calls spent so far
    (lead and members, every worker; ``None`` without a budget).
    """

    run_id: str
    team: str
    team_ref: str | None = None
    prompt: str
    status: RunStatus
    created_at: int
    updated_at: int
    metadata: dict[str, Any] = Field(default_factory=dict)
    parent: RunParent | None = None
    result: RunResult | None = None
    max_active: int | None = None
    trace_carrier: dict[str, str] | None = None
    budget_tokens: int | None = None
    spent_tokens: int | None = None


__all__ = ["FINISHED_STATUSES", "RunParent", "RunRecord", "RunResult", "RunStatus"]
