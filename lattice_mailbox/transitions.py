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

``update_status(..., only_from=STATUSES)`` is a compare-and-set: the move
happens only when the message's current status is one of ``STATUSES`` (and
the table allows it); else :class:`InvalidTransitionError`, nothing changes
(the no-op rule holds: a message already in the target status succeeds). A
caller that read ``parked`` and moves the message to ``pending`` so never
releases a claim taken meanwhile (``processing`` -> ``pending`` is allowed).

``processing`` is entered only through ``claim_next`` (so every claim carries a
token); asking ``update_status`` for it raises :class:`InvalidTransitionError`.
Setting the status a message already has is a no-op that succeeds (so retried
calls are harmless). Leaving ``processing`` by any route clears the claim
(``claimed_by``, ``lease_until``); a message that goes back to ``pending``
keeps its place in FIFO order (its send sequence).
"""

from __future__ import annotations

from collections.abc import Iterable

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


def only_from_set(
    only_from: MessageStatus | str | Iterable[MessageStatus | str] | None,
) -> frozenset[MessageStatus] | None:
    """The statuses of an ``update_status(..., only_from=...)`` argument (one
    status or several; ``None``: any). ``ValueError`` for an unknown status or none at all."""
    if only_from is None:
        return None
    items = [only_from] if isinstance(only_from, MessageStatus | str) else list(only_from)
    if not items:
        raise ValueError("only_from must name at least one status")
    return frozenset(MessageStatus.parse(s) for s in items)


def sources_for(
    target: MessageStatus, only_from: frozenset[MessageStatus] | None = None
) -> frozenset[MessageStatus]:
    """Every status from which ``target`` may be reached by ``update_status``
    (of those in ``only_from``, when given)."""
    sources = frozenset(src for src, targets in ALLOWED.items() if target in targets)
    return sources if only_from is None else sources & only_from


def check_transition(
    message_id: str,
    current: MessageStatus,
    target: MessageStatus,
    only_from: frozenset[MessageStatus] | None = None,
) -> bool:
    """Return ``True`` when the move changes the status, ``False`` when it is
    a no-op (same status). Raise :class:`InvalidTransitionError` naming both
    states when the table above refuses it, or when ``current`` is not in
    ``only_from`` (given)."""
    if current == target:
        return False
    if target not in ALLOWED[current]:
        raise invalid_transition(message_id, current, target)
    if only_from is not None and current not in only_from:
        raise invalid_transition(message_id, current, target, only_from)
    return True


def invalid_transition(
    message_id: str,
    current: MessageStatus | str,
    target: MessageStatus | str,
    only_from: frozenset[MessageStatus] | None = None,
) -> InvalidTransitionError:
    """The error for a refused move, with a hint for the common mistakes
    (``only_from``: the statuses a compare-and-set move asked for)."""
    current, target = MessageStatus(current), MessageStatus(target)
    if only_from is not None and current not in only_from and target in ALLOWED[current]:
        asked = ", ".join(sorted(repr(s.value) for s in only_from))
        hint = f"the move was asked only from {asked} (the message moved meanwhile)"
    elif current.terminal:
        hint = f"{current.value!r} is terminal"
    elif target == S.PROCESSING:
        hint = "only claim_next moves a message to 'processing'"
    else:
        allowed = ", ".join(sorted(s.value for s in ALLOWED[current]))
        hint = f"from {current.value!r} the allowed targets are: {allowed}"
    return InvalidTransitionError(
        f"cannot move message {message_id} from {current.value!r} to {target.value!r}: {hint}"
    )


__all__ = [
    "ALLOWED",
    "STATUS_ORDER",
    "check_transition",
    "invalid_transition",
    "only_from_set",
    "sources_for",
]
