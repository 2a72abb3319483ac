"""The ``TeamMailbox`` protocol and the optional lease capability.

Five message-centric methods make a mailbox (docs/architecture.md, "Core model").
Stores used by the distributed runtime also implement :class:`LeasedMailbox`:
claims carry a lease and a token, and the token fences late writers
(docs/architecture.md, "Crash: leases and fencing").
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from .message import MessageStatus, TeamMessage


class MailboxError(Exception):
    """Base class of mailbox errors."""


class MessageTooLargeError(MailboxError, ValueError):
    """The message body is over the store's size bound (default 1 MiB)."""


class InvalidTransitionError(MailboxError, ValueError):
    """The requested status change is not allowed by the state machine
    (for example ``done`` -> ``pending``)."""


class ClaimError(MailboxError):
    """A lease token was refused. ``reason`` is ``"taken"`` (another worker holds
    the claim now) or ``"missing"`` (the message is no longer claimed: requeued,
    finished or unknown)."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ClaimTakenError(ClaimError):
    """Claim taken by another worker: the lease expired and someone re-claimed it."""

    def __init__(self, message_id: str) -> None:
        super().__init__(f"claim on message {message_id} taken by another worker", reason="taken")


class ClaimMissingError(ClaimError):
    """Claim missing: the message is not in ``processing`` under any claim."""

    def __init__(self, message_id: str) -> None:
        super().__init__(
            f"claim on message {message_id} missing (requeued, finished or unknown)", reason="missing"
        )


@runtime_checkable
class TeamMailbox(Protocol):
    """What the team runtime needs from a mailbox store. All methods are async.

    Mailbox ids are ``"<team>::<member>"``. ``inbox`` and ``claim_next`` are
    oldest-first (FIFO by send order). Terminal states never go back.
    """

    async def send(
        self,
        from_: str,
        to: str,
        content: str,
        *,
        thread_id: str | None = None,
        work_item_id: str | None = None,
        reply_to: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> TeamMessage: ...

    async def inbox(self, mailbox_id: str, status: MessageStatus | str = "pending") -> list[TeamMessage]: ...

    async def get(self, message_id: str) -> TeamMessage | None: ...

    async def claim_next(self, mailbox_id: str) -> TeamMessage | None: ...

    async def update_status(
        self, message_id: str, status: MessageStatus | str, *, only_from: Any = None
    ) -> bool: ...


@runtime_checkable
class LeasedMailbox(TeamMailbox, Protocol):
    """Optional lease capability (Redis, SQL and memory stores implement it).

    ``claim_next(mailbox_id, lease_s=..., worker_id=..., max_in_flight=...)``
    records ``claimed_by``, ``lease_until`` and increments ``attempts``, and
    returns the message with ``claim_token`` set. ``lease_s`` is in **seconds**
    (float). ``max_in_flight`` makes the claim return ``None`` while the mailbox
    already has that many messages in ``processing`` or ``parked`` (a parked
    message waits for a person and keeps its place in a serial mailbox).
    ``claim_next(..., message_id=ID)`` claims that message instead of the
    oldest pending one (``None`` when it is not ``pending`` in that mailbox:
    already claimed, finished, unknown or addressed elsewhere).

    ``complete(message_id, token, "parked")`` is how the claim's holder parks
    a message: it leaves ``processing`` (no lease, so the reaper never requeues
    it), is never claimed while parked, and shows in ``inbox(status="parked")``;
    ``update_status`` then moves it to ``pending`` (retry, keeping its FIFO
    place) or to ``done`` / ``failed`` / ``cancelled``.
    """

    async def extend_lease(self, message_id: str, token: str, lease_s: float) -> int:
        """Push the lease out to now + ``lease_s`` seconds; returns the new
        ``lease_until`` (ms). Raises :class:`ClaimTakenError` / :class:`ClaimMissingError`."""
        ...

    async def requeue_expired(
        self, *, max_attempts: int | None = None, now_ms: int | None = None
    ) -> list[TeamMessage]:
        """Move every claim whose lease has expired back to ``pending`` (or to
        ``failed`` once the message's claims have expired ``max_attempts`` times);
        returns the moved messages with their new status. Only expired claims
        count: a claim that ended by handing the message back on purpose (parked
        then resolved, released to wait for its turn) does not, though every
        claim adds to ``attempts`` (the fence of the next claim)."""
        ...

    async def complete(self, message_id: str, token: str, status: MessageStatus | str) -> TeamMessage:
        """Fenced ``update_status``: only the holder of ``token`` may finish the
        claim. Raises :class:`ClaimTakenError` / :class:`ClaimMissingError`."""
        ...


__all__ = [
    "ClaimError",
    "ClaimMissingError",
    "ClaimTakenError",
    "InvalidTransitionError",
    "LeasedMailbox",
    "MailboxError",
    "MessageTooLargeError",
    "TeamMailbox",
]
