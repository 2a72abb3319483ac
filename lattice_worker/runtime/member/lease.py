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

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from lattice_mailbox.base import ClaimError

from ...agent.abort import AbortController
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


__all__ = ["LeaseKeeper"]
