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
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from lattice_mailbox.base import ClaimError

from ...agent.abort import AbortController, AbortSignal
from ..run.renewal import LeaseLostError, RenewalLoop

logger = logging.getLogger("lattice_worker.runtime.member.lease")


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


T = TypeVar("T")

ABORT_GRACE_SECONDS = 2.0
"""How long (**seconds**) a member's work may go on after its signal was aborted
(claim lost, run cancelled) before it is cancelled: a tool that watches its
``signal`` ends by itself; one that does not (a long ``await``) would otherwise
hold the worker's slot, and a warm shutdown, until it returns."""


class WorkAbandoned(Exception):
    """The work was cancelled :data:`ABORT_GRACE_SECONDS` after its signal was
    aborted (:attr:`reason`: the abort's reason)."""

    def __init__(self, reason: Any) -> None:
        super().__init__(f"cancelled after its signal was aborted: {reason}")
        self.reason = reason


async def until_aborted(work: Awaitable[T], signal: AbortSignal, grace_s: float | None = None) -> T:
    """Await ``work`` in the calling task; once ``signal`` is aborted, cancel
    that task after ``grace_s`` seconds (default :data:`ABORT_GRACE_SECONDS`)
    unless ``work`` ended by then. ``work`` runs in the caller's task, so what
    it raises (``SystemExit`` included) reaches the caller as before.

    Raises :class:`WorkAbandoned` when it was cancelled that way; the caller's
    own cancellation propagates as ``CancelledError``."""
    loop = asyncio.get_running_loop()
    current = asyncio.current_task()
    if current is None:
        raise RuntimeError("until_aborted needs to run in a task")
    grace = ABORT_GRACE_SECONDS if grace_s is None else grace_s
    timers: list[asyncio.TimerHandle] = []
    cut: list[Any] = []
    finished = False

    def cancel(reason: Any) -> None:
        if not finished and not cut:
            cut.append(reason)
            current.cancel()

    def aborted(reason: Any) -> None:  # may come from another thread
        loop.call_soon_threadsafe(lambda: timers.append(loop.call_later(grace, cancel, reason)))

    remove = signal.add_listener(aborted)
    try:
        result = await work
        finished = True
        return result
    except asyncio.CancelledError:
        finished = True
        if cut and current.cancelling() == 1:  # ours alone: nobody else cancelled the caller
            current.uncancel()
            raise WorkAbandoned(cut[0]) from None
        raise
    finally:
        finished = True
        remove()
        for timer in timers:
            timer.cancel()


__all__ = ["ABORT_GRACE_SECONDS", "LeaseKeeper", "WorkAbandoned", "until_aborted"]
