"""Input checks, message ids and the clock shared by every store, and
:class:`CheckedSend`, the ``send`` every store inherits.

Every store runs these checks *before* it writes anything, so bad input gets a
clear error (``TypeError`` for a wrong type, ``ValueError`` for a bad value)
and nothing is half-written.

Mailbox ids are opaque strings of 1..512 characters. Any printable Unicode is
accepted, including ``{``, ``}``, ``:``, spaces and non-ASCII letters, because
no store ever splices an id into a key or a query: the Redis store hashes it,
the SQL store binds it as a parameter. Control characters (newlines, tabs,
NUL...), line/paragraph separators and lone surrogates are refused.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import re
import secrets
import time
import unicodedata
from dataclasses import dataclass
from typing import Any

from .base import MessageTooLargeError
from .message import MessageStatus, TeamMessage
from .transitions import ALLOWED, invalid_transition

MAX_ID_CHARS = 512
"""Longest accepted mailbox id, worker id or thread/work-item/reply id (characters)."""

DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024
"""Default bound on ``content`` (UTF-8) + ``metadata`` (JSON) in bytes: 1 MiB."""

_REFUSED_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})
_MESSAGE_ID = re.compile(r"[0-9a-f]{16}-[0-9a-f]{32}")


def now_ms() -> int:
    """Wall-clock time in milliseconds since the Unix epoch."""
    return time.time_ns() // 1_000_000


@functools.lru_cache(maxsize=4096)
def mailbox_tag(mailbox_id: str) -> str:
    """The first 16 hex digits of SHA-256(mailbox id, UTF-8). Used as the Redis
    hash tag of the mailbox and as the prefix of its message ids (cached: ids
    repeat a lot)."""
    return hashlib.sha256(mailbox_id.encode("utf-8")).hexdigest()[:16]


def new_message_id(mailbox_id: str) -> str:
    """A fresh message id ``"<tag>-<32 random hex>"`` (49 characters); the tag
    lets the Redis store find a message's keys from its id alone."""
    return f"{mailbox_tag(mailbox_id)}-{secrets.token_hex(16)}"


def dedup_message_id(mailbox_id: str, dedup_key: str) -> str:
    """The message id a send with ``dedup_key`` gets: ``"<tag>-<32 hex>"`` like
    :func:`new_message_id`, the hex part a SHA-256 of the key (the same key to
    the same mailbox always names the same message)."""
    digest = hashlib.sha256(f"{mailbox_id}\x00{dedup_key}".encode()).hexdigest()[:32]
    return f"{mailbox_tag(mailbox_id)}-{digest}"


def message_id_tag(message_id: str) -> str | None:
    """The mailbox tag inside a well-formed message id, else ``None``.
    Raises ``TypeError`` when ``message_id`` is not a string."""
    if not isinstance(message_id, str):
        raise TypeError(f"message id must be a str, not {type(message_id).__name__}")
    return message_id[:16] if _MESSAGE_ID.fullmatch(message_id) else None


def new_token() -> str:
    """A fresh claim token (32 random hex digits)."""
    return secrets.token_hex(16)


def check_name(value: Any, what: str = "mailbox id") -> str:
    """Validate a mailbox id (or another short identifier named by ``what``).

    Raises ``TypeError`` for a non-string and ``ValueError`` for an empty
    string, one over :data:`MAX_ID_CHARS` characters, or one holding control
    characters, line separators or lone surrogates."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{what} must not be empty")
    if len(value) > MAX_ID_CHARS:
        raise ValueError(f"{what} is {len(value)} characters long; the limit is {MAX_ID_CHARS}")
    bad = _refused_char(value)
    if bad is not None:
        raise ValueError(f"{what} {value!r} contains the control or separator character {bad!r}")
    return value


@functools.lru_cache(maxsize=4096)
def _refused_char(value: str) -> str | None:
    """The first refused character of ``value`` (cached: ids repeat a lot)."""
    for ch in value:
        if unicodedata.category(ch) in _REFUSED_CATEGORIES:
            return ch
    return None


def check_optional_name(value: Any, what: str) -> str | None:
    """``None`` or a valid :func:`check_name` string."""
    return None if value is None else check_name(value, what)


def check_status_filter(status: Any) -> MessageStatus | None:
    """``"all"`` -> ``None``; otherwise :meth:`MessageStatus.parse` (``ValueError`` if unknown)."""
    if status == "all":
        return None
    return MessageStatus.parse(status)


def check_limit(limit: Any) -> int | None:
    """``None`` or a positive ``int`` (``ValueError``/``TypeError`` otherwise)."""
    return check_positive_int(limit, "limit")


def check_positive_int(value: Any, what: str) -> int | None:
    """``None`` or an ``int`` >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int or None, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return value


def lease_ms(lease_s: Any, *, required: bool = False) -> int | None:
    """Convert a lease in **seconds** (int or float, > 0, finite) to whole
    milliseconds (at least 1). ``None`` means no lease unless ``required``."""
    if lease_s is None:
        if required:
            raise ValueError("lease_s is required")
        return None
    if isinstance(lease_s, bool) or not isinstance(lease_s, int | float):
        raise TypeError(f"lease_s must be a number of seconds, not {type(lease_s).__name__}")
    if not math.isfinite(lease_s) or lease_s <= 0:
        raise ValueError(f"lease_s must be a positive, finite number of seconds, got {lease_s!r}")
    return max(1, round(lease_s * 1000))


def check_now_ms(value: Any) -> int | None:
    """``None`` or an ``int`` of milliseconds since the epoch."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"now_ms must be an int (milliseconds) or None, not {type(value).__name__}")
    return value


def check_token(token: Any) -> str:
    """A claim token must be a string."""
    if not isinstance(token, str):
        raise TypeError(f"claim token must be a str, not {type(token).__name__}")
    return token


def check_prefix_filter(prefix: Any) -> str | None:
    """The ``prefix`` of ``mailbox_ids``: ``None`` or a string (``TypeError`` otherwise)."""
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str or None, not {type(prefix).__name__}")
    return prefix


# -- the argument checks of one store method each (the mailbox id is checked by the store) --


def check_inbox(status: Any, limit: Any) -> tuple[MessageStatus | None, int | None]:
    """``inbox``: the status filter (``None`` for ``"all"``) and the limit.
    ``ValueError`` for an unknown status; see :func:`check_limit`."""
    return check_status_filter(status), check_limit(limit)


def check_claim(
    lease_s: Any, worker_id: Any, max_in_flight: Any
) -> tuple[int | None, str | None, int | None]:
    """``claim_next``: the lease in milliseconds (``None``: never expires), the
    worker id and the in-flight limit, checked in that order."""
    return (
        lease_ms(lease_s),
        check_optional_name(worker_id, "worker_id"),
        check_positive_int(max_in_flight, "max_in_flight"),
    )


def check_claim_id(message_id: Any) -> str:
    """``claim_next(message_id=...)``: the id to claim, ``""`` for ``None`` (the
    oldest pending one). Raises ``TypeError`` for a non-string id."""
    if message_id is None:
        return ""
    message_id_tag(message_id)  # raises TypeError for a non-string
    return str(message_id)


def check_extend(token: Any, lease_s: Any) -> int:
    """``extend_lease``: the token, then the (required) lease in milliseconds."""
    check_token(token)
    ms = lease_ms(lease_s, required=True)
    assert ms is not None
    return ms


def check_complete(message_id: Any, token: Any, status: Any) -> tuple[MessageStatus, str | None]:
    """``complete``: the target status and the tag of ``message_id`` (``None``
    when malformed). Raises ``ValueError`` for an unknown status, ``TypeError``
    for a non-string token or id, and :class:`InvalidTransitionError` when the
    target cannot follow ``processing``."""
    target = MessageStatus.parse(status)
    check_token(token)
    tag = message_id_tag(message_id)
    if target not in ALLOWED[MessageStatus.PROCESSING]:
        raise invalid_transition(message_id, MessageStatus.PROCESSING, target)
    return target, tag


def check_requeue(max_attempts: Any, now: Any) -> tuple[int | None, int | None]:
    """``requeue_expired``: ``max_attempts`` (``None`` or >= 1) and ``now_ms``
    (``None`` or an int of milliseconds)."""
    return check_positive_int(max_attempts, "max_attempts"), check_now_ms(now)


@dataclass(frozen=True, slots=True)
class Outgoing:
    """A validated ``send`` request; ``metadata_json`` is its canonical JSON."""

    from_: str
    to: str
    content: str
    thread_id: str | None
    work_item_id: str | None
    reply_to: str | None
    metadata: dict[str, Any]
    metadata_json: str
    dedup_key: str | None = None

    def new_message(self) -> TeamMessage:
        """The ``pending`` message this request creates: a fresh id
        (:func:`new_message_id`; :func:`dedup_message_id` with a ``dedup_key``),
        ``created_at`` now (ms), ``thread_id`` defaulting to the message's own id."""
        if self.dedup_key is not None:
            message_id = dedup_message_id(self.to, self.dedup_key)
        else:
            message_id = new_message_id(self.to)
        return TeamMessage(
            id=message_id,
            from_=self.from_,
            to=self.to,
            content=self.content,
            created_at=now_ms(),
            thread_id=self.thread_id or message_id,
            work_item_id=self.work_item_id,
            reply_to=self.reply_to,
            metadata=self.metadata,
        )


def check_send(
    from_: Any,
    to: Any,
    content: Any,
    *,
    thread_id: Any,
    work_item_id: Any,
    reply_to: Any,
    metadata: Any,
    max_message_bytes: int,
    dedup_key: Any = None,
) -> Outgoing:
    """Validate every ``send`` argument and the size bound.

    Raises ``TypeError``/``ValueError`` for bad fields (including NUL
    characters in ``content``, which PostgreSQL cannot store) and
    :class:`MessageTooLargeError` (a ``ValueError``) when the UTF-8 content
    plus the metadata JSON is over ``max_message_bytes`` bytes."""
    check_name(from_, "sender (from_)")
    check_name(to, "recipient mailbox id (to)")
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, not {type(content).__name__}")
    if "\x00" in content:
        # PostgreSQL text cannot hold NUL; every store refuses it so a mailbox URL can change freely.
        raise ValueError("message content must not contain NUL characters (\\x00)")
    thread_id = check_optional_name(thread_id, "thread_id")
    work_item_id = check_optional_name(work_item_id, "work_item_id")
    reply_to = check_optional_name(reply_to, "reply_to")
    if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key or len(dedup_key) > 1024):
        raise ValueError(
            f"dedup_key must be a non-empty str of at most 1024 characters, got {dedup_key!r:.80}"
        )
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict or None, not {type(metadata).__name__}")
    try:
        metadata_json = json.dumps(metadata, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        size = len(content.encode("utf-8")) + len(metadata_json.encode("utf-8"))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"message content/metadata cannot be stored: {exc}") from None
    if size > max_message_bytes:
        raise MessageTooLargeError(
            f"message to {to!r} is {size} bytes (content + metadata JSON); the bound is {max_message_bytes} bytes"
        )
    # The stored metadata is exactly what JSON gives back (tuples -> lists ...): a flat dict of
    # str keys and str/int/bool/None values comes back as an equal copy, anything else is
    # round-tripped.
    if all(type(k) is str and type(v) in _FLAT_JSON for k, v in metadata.items()):
        stored = dict(metadata)
    else:
        stored = json.loads(metadata_json)
    return Outgoing(from_, to, content, thread_id, work_item_id, reply_to, stored, metadata_json, dedup_key)


_FLAT_JSON = frozenset({str, int, bool, type(None)})


class CheckedSend:
    """Mixin giving a store the protocol's ``send``: the arguments are checked
    (:func:`check_send`, against ``self.max_message_bytes``) before the store's
    ``_append(out)`` writes the message and returns it."""

    max_message_bytes: int

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
        dedup_key: str | None = None,
    ) -> TeamMessage:
        """Append a ``pending`` message to mailbox ``to``; returns it
        (``created_at`` in ms, ``thread_id`` defaulting to its id).

        ``dedup_key``: sending again with the same key to the same mailbox
        sends nothing and returns the message the first send stored (as it
        is now: its status may have moved on); e.g. a tool call's
        ``effect_key``, so a call run again after a crash sends once.

        Raises ``TypeError``/``ValueError``/:class:`MessageTooLargeError` before
        writing anything; a store's own failure (network, database) leaves the
        message either fully written or absent."""
        out = check_send(
            from_,
            to,
            content,
            thread_id=thread_id,
            work_item_id=work_item_id,
            reply_to=reply_to,
            metadata=metadata,
            max_message_bytes=self.max_message_bytes,
            dedup_key=dedup_key,
        )
        return await self._append(out)

    async def _append(self, out: Outgoing) -> TeamMessage:
        """Store the message ``out`` describes (see :meth:`Outgoing.new_message`)."""
        raise NotImplementedError


def check_max_message_bytes(value: Any) -> int:
    """The size bound must be a positive ``int`` of bytes."""
    checked = check_positive_int(value, "max_message_bytes")
    if checked is None:
        raise ValueError("max_message_bytes must be a positive int")
    return checked


__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MAX_ID_CHARS",
    "CheckedSend",
    "Outgoing",
    "check_claim",
    "check_complete",
    "check_extend",
    "check_inbox",
    "check_limit",
    "check_max_message_bytes",
    "check_name",
    "check_now_ms",
    "check_optional_name",
    "check_positive_int",
    "check_prefix_filter",
    "check_requeue",
    "check_send",
    "check_status_filter",
    "check_token",
    "lease_ms",
    "mailbox_tag",
    "message_id_tag",
    "new_message_id",
    "new_token",
    "now_ms",
]
