"""Renewing a lease while a block runs: :class:`RenewalLoop`, the base of the
member's claim lease (:mod:`lattice_worker.runtime.member.lease`), the lead's
run lease (:mod:`lattice_worker.runtime.lead.lease`) and the reaper's lock.

Each renews every ``lease_s / 3`` seconds from one ``lease_s / 3`` after the
block began; most blocks end before the first renewal, so a timer starts the
renewal task lazily. docs/architecture.md, "Crash", says why leases are
renewed and what losing one means.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

logger = logging.getLogger("lattice_worker.runtime.run.renewal")


class LeaseLostError(Exception):
    """The claim this worker held was lost (``reason``: ``"taken"`` or ``"missing"``)."""

    def __init__(self, message_id: str, reason: str) -> None:
        super().__init__(f"lease on message {message_id} lost ({reason})")
        self.message_id = message_id
        self.reason = reason


class RenewalLoop:
    """Renews something every ``lease_s / 3`` seconds while an ``async with``
    block runs. Subclasses implement ``renew_once() -> bool`` (False stops the
    loop) and may override ``after_renewal() -> bool`` (False stops it too).
    ``lease_s`` is in **seconds**; a non-positive value is a ``ValueError``."""

    def __init__(self, lease_s: float, task_name: str) -> None:
        if not lease_s or lease_s <= 0:
            raise ValueError(
                f"{type(self).__name__}: lease_s must be a positive number of seconds, got {lease_s!r}"
            )
        self.lease_s = float(lease_s)
        self.renewals = 0
        self._task_name = task_name
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def interval(self) -> float:
        """Seconds between renewals (a third of the lease)."""
        return self.lease_s / 3.0

    async def __aenter__(self) -> Any:
        # the renewal task starts at the first renewal: most blocks end before it
        # (a timer is cheaper to set and cancel than a task)
        self._timer = asyncio.get_running_loop().call_later(self.interval, self._start)
        return self

    def _start(self) -> None:
        self._timer = None
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._task_name)

    async def __aexit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def renew_once(self) -> bool:
        raise NotImplementedError

    async def after_renewal(self) -> bool:
        return True

    async def _run(self) -> None:
        """Renew now (one interval after the block began), then every interval."""
        while True:
            if not await self.renew_once() or not await self.after_renewal():
                return
            await asyncio.sleep(self.interval)


__all__ = ["LeaseLostError", "RenewalLoop"]
