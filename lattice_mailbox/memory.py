"""``MemoryMailbox``: the embedded, in-process mailbox store (the default).

Mailbox semantics: docs/architecture.md, "Core model"; leases
and fencing from docs/architecture.md. Every operation is one critical section
with no ``await`` inside, guarded by a ``threading.Lock``, so it is safe under
asyncio concurrency and when called from several threads. Nothing survives the
process.
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass, field
from typing import Any

from .base import ClaimMissingError, ClaimTakenError
from .message import MessageStatus, TeamMessage
from .transitions import check_transition, only_from_set
from .validation import (
    DEFAULT_MAX_MESSAGE_BYTES,
    CheckedSend,
    Outgoing,
    check_claim,
    check_claim_id,
    check_complete,
    check_extend,
    check_inbox,
    check_max_message_bytes,
    check_name,
    check_prefix_filter,
    check_requeue,
    message_id_tag,
    new_token,
    now_ms,
)

S = MessageStatus


@dataclass(slots=True)
class _Record:
    message: TeamMessage  # stored copy, never handed out, claim_token always None
    seq: int
    fence: str | None = None  # current claim token; kept after a fenced complete()
    expired: int = 0  # claims whose lease expired (requeue_expired's max_attempts counts these)


@dataclass(slots=True)
class _Box:
    by_status: dict[MessageStatus, dict[int, str]] = field(default_factory=lambda: {s: {} for s in S})
    pending_heap: list[tuple[int, str]] = field(default_factory=list)  # lazily cleaned


class MemoryMailbox(CheckedSend):
    """In-memory :class:`~lattice_mailbox.base.LeasedMailbox`.

    ``max_message_bytes`` bounds content + metadata JSON (bytes, default 1 MiB).
    All times are milliseconds since the epoch except ``lease_s`` (seconds).
    """

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = check_max_message_bytes(max_message_bytes)
        self._lock = threading.Lock()
        self._records: dict[str, _Record] = {}
        self._boxes: dict[str, _Box] = {}
        self._seq = 0

    # -- the five protocol methods -------------------------------------------------

    # ``send`` (argument checks) comes from CheckedSend; it stores through _append.

    async def _append(self, out: Outgoing) -> TeamMessage:
        message = out.new_message()
        with self._lock:
            earlier = self._records.get(message.id) if out.dedup_key is not None else None
            if earlier is not None:  # sent before under this key
                return earlier.message.model_copy(deep=True)
            self._seq += 1
            seq = self._seq
            self._records[message.id] = _Record(message, seq)
            box = self._boxes.setdefault(out.to, _Box())
            box.by_status[S.PENDING][seq] = message.id
            heapq.heappush(box.pending_heap, (seq, message.id))
            return message.model_copy(deep=True)

    async def inbox(
        self, mailbox_id: str, status: MessageStatus | str = "pending", *, limit: int | None = None
    ) -> list[TeamMessage]:
        """Messages of ``mailbox_id`` with ``status`` (or ``"all"``), oldest first,
        at most ``limit``. Raises ``ValueError`` for an unknown status."""
        check_name(mailbox_id)
        wanted, limit = check_inbox(status, limit)
        with self._lock:
            box = self._boxes.get(mailbox_id)
            if box is None:
                return []
            if wanted is None:
                index = {seq: mid for by_seq in box.by_status.values() for seq, mid in by_seq.items()}
            else:
                index = box.by_status[wanted]
            ids = [index[seq] for seq in sorted(index)]
            if limit is not None:
                ids = ids[:limit]
            return [self._records[mid].message.model_copy(deep=True) for mid in ids]

    async def get(self, message_id: str) -> TeamMessage | None:
        """The message with this id, or ``None``."""
        message_id_tag(message_id)  # type check
        with self._lock:
            record = self._records.get(message_id)
            return None if record is None else record.message.model_copy(deep=True)

    async def claim_next(
        self,
        mailbox_id: str,
        *,
        lease_s: float | None = None,
        worker_id: str | None = None,
        max_in_flight: int | None = None,
        message_id: str | None = None,
    ) -> TeamMessage | None:
        """Move the oldest ``pending`` message of ``mailbox_id`` to ``processing``
        and return it with a fresh ``claim_token``; ``None`` when nothing is
        pending or ``max_in_flight`` messages are already in ``processing`` or
        ``parked`` (a parked message still holds its mailbox's place).
        ``lease_s`` (seconds) sets ``lease_until`` (ms); without it the claim never expires.
        ``message_id``: claim that message instead (``None`` when it is not
        pending in ``mailbox_id``)."""
        check_name(mailbox_id)
        ms, worker_id, max_in_flight = check_claim(lease_s, worker_id, max_in_flight)
        wanted = check_claim_id(message_id)
        with self._lock:
            box = self._boxes.get(mailbox_id)
            if box is None:
                return None
            in_flight = len(box.by_status[S.PROCESSING]) + len(box.by_status[S.PARKED])
            if max_in_flight is not None and in_flight >= max_in_flight:
                return None
            pending = box.by_status[S.PENDING]
            if wanted:
                found = self._records.get(wanted)
                if found is None or found.message.to != mailbox_id or found.message.status != S.PENDING:
                    return None
                message_id = wanted  # its heap entry goes stale: skipped by the loop below later
            else:
                while box.pending_heap:
                    seq, message_id = heapq.heappop(box.pending_heap)
                    if pending.get(seq) == message_id:
                        break
                else:
                    return None
            record = self._records[message_id]
            self._move(box, record, S.PROCESSING)
            token = new_token()
            record.fence = token
            msg = record.message
            msg.attempts += 1
            msg.claimed_by = worker_id
            msg.lease_until = None if ms is None else now_ms() + ms
            out = msg.model_copy(deep=True)
            out.claim_token = token
            return out

    async def update_status(
        self, message_id: str, status: MessageStatus | str, *, only_from: Any = None
    ) -> bool:
        """Set a message's status per :mod:`lattice_mailbox.transitions`;
        ``only_from`` (a status or several): only from those (a compare-and-set).
        ``False`` for an unknown id; ``ValueError`` for an unknown status;
        :class:`InvalidTransitionError` for a refused move (nothing changes)."""
        target = MessageStatus.parse(status)
        allowed_from = only_from_set(only_from)
        message_id_tag(message_id)  # type check
        with self._lock:
            record = self._records.get(message_id)
            if record is None:
                return False
            if check_transition(message_id, record.message.status, target, allowed_from):
                self._finish(record, target, keep_fence=False)
            return True

    # -- lease capability --------------------------------------------------------

    async def extend_lease(self, message_id: str, token: str, lease_s: float) -> int:
        """Push the lease to now + ``lease_s`` seconds; returns the new
        ``lease_until`` (ms). Raises :class:`ClaimTakenError` / :class:`ClaimMissingError`."""
        ms = check_extend(token, lease_s)
        with self._lock:
            record = self._claimed(message_id, token)
            record.message.lease_until = now_ms() + ms
            return record.message.lease_until

    async def complete(self, message_id: str, token: str, status: MessageStatus | str) -> TeamMessage:
        """Fenced ``update_status`` from ``processing``: only the holder of ``token``
        may finish the claim. Repeating the same successful call returns the
        message again. Raises ``ValueError`` (unknown status),
        :class:`InvalidTransitionError` (target ``processing``),
        :class:`ClaimTakenError` or :class:`ClaimMissingError`."""
        target, _ = check_complete(message_id, token, status)
        with self._lock:
            record = self._records.get(message_id)
            if (
                record is not None
                and record.message.status != S.PROCESSING
                and record.fence == token
                and record.message.status == target
            ):
                return record.message.model_copy(deep=True)  # replay of our own completion
            record = self._claimed(message_id, token)
            self._finish(record, target, keep_fence=True)
            return record.message.model_copy(deep=True)

    async def requeue_expired(
        self, *, max_attempts: int | None = None, now_ms: int | None = None
    ) -> list[TeamMessage]:
        """Move every ``processing`` message whose ``lease_until`` <= now (ms) back to
        ``pending``, or to ``failed`` once its claims expired ``max_attempts`` times
        (see :meth:`LeasedMailbox.requeue_expired`); returns the moved messages with their new status, oldest first per mailbox."""
        max_attempts, now = check_requeue(max_attempts, now_ms)
        now = _now() if now is None else now
        moved: list[TeamMessage] = []
        with self._lock:
            for box in self._boxes.values():
                processing = box.by_status[S.PROCESSING]
                for seq in sorted(processing):
                    record = self._records[processing[seq]]
                    lease_until = record.message.lease_until
                    if lease_until is None or lease_until > now:
                        continue
                    record.expired += 1
                    exhausted = max_attempts is not None and record.expired >= max_attempts
                    self._finish(record, S.FAILED if exhausted else S.PENDING, keep_fence=False)
                    moved.append(record.message.model_copy(deep=True))
        return moved

    # -- extras --------------------------------------------------------------------

    async def counts(self, mailbox_id: str) -> dict[str, int]:
        """Number of messages per status value (every status present, zeros included)."""
        check_name(mailbox_id)
        with self._lock:
            box = self._boxes.get(mailbox_id)
            return {s.value: (0 if box is None else len(box.by_status[s])) for s in S}

    async def mailbox_ids(self, prefix: str | None = None) -> list[str]:
        """Every mailbox that received a message, sorted; only those starting
        with ``prefix`` when given."""
        check_prefix_filter(prefix)
        with self._lock:
            return sorted(m for m in self._boxes if prefix is None or m.startswith(prefix))

    async def aclose(self) -> None:
        """Nothing to release (kept for symmetry with the other stores)."""

    # -- internals (call with the lock held) -----------------------------------------

    def _claimed(self, message_id: str, token: str) -> _Record:
        record = self._records.get(message_id) if isinstance(message_id, str) else None
        if record is None or record.message.status != S.PROCESSING:
            raise ClaimMissingError(message_id)
        if record.fence != token:
            raise ClaimTakenError(message_id)
        return record

    def _move(self, box: _Box, record: _Record, target: MessageStatus) -> None:
        msg = record.message
        del box.by_status[msg.status][record.seq]
        box.by_status[target][record.seq] = msg.id
        if target == S.PENDING:
            heapq.heappush(box.pending_heap, (record.seq, msg.id))
        msg.status = target

    def _finish(self, record: _Record, target: MessageStatus, *, keep_fence: bool) -> None:
        msg = record.message
        if msg.status == S.PROCESSING:
            msg.claimed_by = None
            msg.lease_until = None
        if not keep_fence:
            record.fence = None  # only the holder's own completion can be replayed
        self._move(self._boxes[msg.to], record, target)


def _now() -> int:
    return now_ms()


__all__ = ["MemoryMailbox"]
