"""Lease renewal while a member works on a claimed message.

docs/architecture.md, "Crash": a claim carries a lease (``lease_until``) that
the worker renews while the member runs. :class:`LeaseKeeper` calls
``mailbox.extend_lease(message_id, token, lease_s)`` every ``lease_s / 3``
seconds. When the store refuses the token (``ClaimTakenError``: the lease
expired and another worker re-claimed the message; ``ClaimMissingError``: the
message was requeued or finished elsewhere) the keeper aborts the member
run's signal and records the loss; the caller must then discard the run's
outcome -- the successor owns the message now.

A transient store failure (Redis briefly unreachable) is logged and retried on
the next tick; if the lease expires meanwhile, the next renewal reports the
loss.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lattice_mailbox.base import ClaimError

from ..agent.abort import AbortController

logger = logging.getLogger("lattice_worker.runtime.leases")


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


class LeaseKeeper(RenewalLoop):
    """Renew one claim until the ``async with`` block ends.

    Args:
        mailbox: a leased mailbox (``extend_lease(message_id, token, lease_s)``).
        message_id: the claimed message.
        token: the claim token ``claim_next`` returned.
        lease_s: lease length in **seconds** (float); renewal every ``lease_s / 3``.
        controller: aborted (reason :class:`LeaseLostError`) when the claim is lost.
        check: optional ``async () -> str | None`` run on every tick; a
            non-empty string aborts the controller with that reason (used to
            stop a member whose run was cancelled). Its failures are logged.

    After the block, :attr:`lost` is ``None`` or the :class:`LeaseLostError`.
    """

    def __init__(
        self,
        mailbox: Any,
        message_id: str,
        token: str,
        lease_s: float,
        controller: AbortController,
        *,
        check: Callable[[], Awaitable[str | None]] | None = None,
    ) -> None:
        super().__init__(lease_s, f"lease:{message_id}")
        self.mailbox = mailbox
        self.message_id = message_id
        self.token = token
        self.controller = controller
        self.check = check
        self.lost: LeaseLostError | None = None
        self.aborted_reason: str | None = None

    async def renew_once(self) -> bool:
        """One renewal. Returns False (and aborts the controller) when the claim is lost."""
        try:
            await self.mailbox.extend_lease(self.message_id, self.token, self.lease_s)
        except ClaimError as exc:
            self.lost = LeaseLostError(self.message_id, exc.reason)
            logger.warning("lease lost on %s: %s; aborting the member run", self.message_id, exc)
            self.controller.abort(self.lost)
            return False
        except Exception:  # transient: retry next tick
            logger.warning("lease renewal of %s failed; retrying", self.message_id, exc_info=True)
            return True
        self.renewals += 1
        return True

    async def after_renewal(self) -> bool:
        """Run ``check``; a non-empty reason aborts the controller and stops renewing."""
        if self.check is None:
            return True
        try:
            reason = await self.check()
        except Exception:
            logger.warning("lease check of %s failed", self.message_id, exc_info=True)
            return True
        if reason:
            self.aborted_reason = reason
            self.controller.abort(reason)
            return False
        return True


__all__ = ["LeaseKeeper", "LeaseLostError", "RenewalLoop"]
