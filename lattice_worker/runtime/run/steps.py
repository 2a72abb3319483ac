"""Enqueueing the next steps of a run as Celery tasks.

Every follow-up step goes through the broker as its own task, also on a queue
this worker consumes: doorbells are ``lattice.deliver(mailbox_id[, message_id])`` on the
member's queue ``<prefix>.<team>.<member>``; resumes ``lattice.resume_lead(run_id)``
and new (child) runs ``lattice.run_lead(run_id)`` on ``<prefix>.<team>.lead``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lattice_client.celery_config import DELIVER_TASK, RESUME_LEAD_TASK, RUN_LEAD_TASK, queue_name

from ...team.ids import LEAD, split_mailbox_id

TaskSender = Callable[..., None]
"""``send_task(task_name, args, queue)``: enqueue one Celery task (sync; in a
worker Celery's ``app.send_task``, in tests a collector). A step that waits
for its turn (shared rate limits) is sent with ``countdown=`` seconds as a
keyword too (Celery's countdown: the task runs no earlier)."""


class StepSender:
    """Sends a run's next steps through ``send_task`` under key prefix ``prefix``."""

    def __init__(self, send_task: TaskSender, prefix: str) -> None:
        self.send_task = send_task
        self.prefix = prefix

    def _send(self, task: str, args: list[Any], queue: str, countdown: float | None) -> None:
        if countdown is None:
            self.send_task(task, args, queue)
        else:
            self.send_task(task, args, queue, countdown=max(0.0, float(countdown)))

    def ring(self, mailbox_id: str, message_id: str | None = None, *, countdown: float | None = None) -> None:
        """Ring the doorbell of ``mailbox_id`` (``<team>::<member>``; ``ValueError``
        for anything else): ``lattice.deliver`` on its member queue, for the
        message ``message_id`` when given (a work item its run let start), else
        for the oldest one its run lets start. ``countdown``: seconds before it
        may run (a call waiting for its turn)."""
        team, member = split_mailbox_id(mailbox_id)
        args = [mailbox_id, message_id] if message_id else [mailbox_id]
        self._send(DELIVER_TASK, args, queue_name(self.prefix, team, member), countdown)

    def resume(self, run_id: str, team: str, *, countdown: float | None = None) -> None:
        """``lattice.resume_lead(run_id)`` on ``team``'s lead queue (``countdown``: as for :meth:`ring`)."""
        self._send(RESUME_LEAD_TASK, [run_id], queue_name(self.prefix, team, LEAD), countdown)

    def run_lead(self, run_id: str, team: str) -> None:
        """``lattice.run_lead(run_id)`` on ``team``'s lead queue (child runs)."""
        self.send_task(RUN_LEAD_TASK, [run_id], queue_name(self.prefix, team, LEAD))


__all__ = ["StepSender", "TaskSender"]
