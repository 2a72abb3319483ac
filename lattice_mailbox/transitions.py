"""The mailbox state machine: which ``update_status`` moves are allowed.

The mailbox life cycle (``send`` writes ``pending``,
``claim_next`` moves ``pending`` -> ``processing``, ``update_status`` finishes);
design docs/architecture.md, "Core model" (``parked``) and "Crash: leases and fencing".

The full table (every store enforces the same one; the Redis scripts receive
the allowed source states from here, so there is one source of truth):

============  ==========================================================
from          allowed targets
============  ==========================================================
pending       done, failed, cancelled, read, parked
processing    pending (release), done, failed, cancelled, read, parked
read          done, failed, cancelled
parked        pending (retry), done, failed, cancelled
done          (none: terminal)
failed        (none: terminal)
cancelled     (none: terminal)
============  ==========================================================

``processing`` is entered only through ``claim_next`` (so every claim carries a
token); asking ``update_status`` for it raises :class:`InvalidTransitionError`.
Setting the status a message already has is a no-op that succeeds (so retried
calls are harmless). Leaving ``processing`` by any route clears the claim
(``claimed_by``, ``lease_until``); a message that goes back to ``pending``
keeps its place in FIFO order (its send sequence).
"""

from __future__ import annotations

from .base import InvalidTransitionError
from .message import MessageStatus

S = MessageStatus

ALLOWED: dict[MessageStatus, frozenset[MessageStatus]] = {
    S.PENDING: frozenset({S.DONE, S.FAILED, S.CANCELLED, S.READ, S.PARKED}),
    S.PROCESSING: frozenset({S.PENDING, S.DONE, S.FAILED, S.CANCELLED, S.READ, S.PARKED}),
    S.READ: frozenset({S.DONE, S.FAILED, S.CANCELLED}),
    S.PARKED: frozenset({S.PENDING, S.DONE, S.FAILED, S.CANCELLED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}

#: Status names in a fixed order (the order of the per-status index keys the
#: Redis scripts receive).
STATUS_ORDER: tuple[MessageStatus, ...] = tuple(MessageStatus)


def sources_for(target: MessageStatus) -> frozenset[MessageStatus]:
    """Every status from which ``target`` may be reached by ``update_status``."""
    return frozenset(src for src, targets in ALLOWED.items() if target in targets)


def check_transition(message_id: str, current: MessageStatus, target: MessageStatus) -> bool:
    """Return ``True`` when the move changes the status, ``False`` when it is
    a no-op (same status). Raise :class:`InvalidTransitionError` naming both
    states when the table above refuses it."""
    if current == target:
        return False
    if target not in ALLOWED[current]:
        raise invalid_transition(message_id, current, target)
    return True


def invalid_transition(
    message_id: str, current: MessageStatus | str, target: MessageStatus | str
) -> InvalidTransitionError:
    """The error for a refused move, with a hint for the common mistakes."""
    current, target = MessageStatus(current), MessageStatus(target)
    if current.terminal:
        hint = f"{current.value!r} is terminal"
    elif target == S.PROCESSING:
        hint = "only claim_next moves a message to 'processing'"
    else:
        allowed = ", ".join(sorted(s.value for s in ALLOWED[current]))
        hint = f"from {current.value!r} the allowed targets are: {allowed}"
    return InvalidTransitionError(
        f"cannot move message {message_id} from {current.value!r} to {target.value!r}: {hint}"
    )


__all__ = ["ALLOWED", "STATUS_ORDER", "check_transition", "invalid_transition", "sources_for"]
