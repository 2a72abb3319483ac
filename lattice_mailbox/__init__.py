"""lattice_mailbox: the ``TeamMailbox`` protocol and its stores.

Spec: AgentLattice "Durable mailbox storage"; design DESIGN.md sections 3 and 5.
This package knows nothing about agents.

* :class:`MemoryMailbox` - in-process (the embedded default).
* :class:`RedisMailbox` - distributed, one atomic Lua script per operation.
* :class:`SQLMailbox` - durable, SQLite file or PostgreSQL.

All three implement the five protocol methods plus the lease capability
(``extend_lease``, ``complete``, ``requeue_expired``) and ``counts``,
``mailbox_ids`` and ``aclose``. The state machine is in
:mod:`lattice_mailbox.transitions`.

The Redis and SQL stores are imported lazily, so ``import lattice_mailbox``
does not load redis-py or SQLAlchemy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import (
    ClaimError,
    ClaimMissingError,
    ClaimTakenError,
    InvalidTransitionError,
    LeasedMailbox,
    MailboxError,
    MessageTooLargeError,
    TeamMailbox,
)
from .memory import MemoryMailbox
from .message import TERMINAL_STATUSES, MessageStatus, TeamMessage

if TYPE_CHECKING:
    from .redis import RedisMailbox
    from .sql import SQLMailbox

_REDIS_SCHEMES = ("redis", "rediss", "unix")
_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
ACCEPTED_SCHEMES = (
    "memory://",
    "redis://",
    "rediss://",
    "unix://",
    "sqlite:///path",
    "postgresql://",
    "postgresql+psycopg://",
)


def mailbox_from_url(url: str, **kwargs: Any) -> MemoryMailbox | RedisMailbox | SQLMailbox:
    """Build a store from a URL; keyword arguments go to its constructor.

    * ``memory://`` -> :class:`MemoryMailbox`
    * ``redis://...``, ``rediss://...``, ``unix://...`` -> :class:`RedisMailbox`
      (``prefix=...``, ``max_message_bytes=...``)
    * ``sqlite:///path``, ``postgresql://...``, ``postgres://...``,
      ``postgresql+psycopg://...`` -> :class:`SQLMailbox` (``table_prefix=...``)

    Raises ``ValueError`` naming the accepted schemes for anything else and
    ``TypeError`` when ``url`` is not a string.
    """
    if not isinstance(url, str):
        raise TypeError(f"mailbox URL must be a str, not {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "memory":
        return MemoryMailbox(**kwargs)
    if sep and scheme in _REDIS_SCHEMES:
        from .redis import RedisMailbox

        return RedisMailbox(url, **kwargs)
    if sep and scheme in _SQL_SCHEMES:
        from .sql import SQLMailbox

        return SQLMailbox(url, **kwargs)
    raise ValueError(f"unsupported mailbox URL {url!r}; accepted schemes: {', '.join(ACCEPTED_SCHEMES)}")


def __getattr__(name: str) -> Any:
    if name == "RedisMailbox":
        from .redis import RedisMailbox

        return RedisMailbox
    if name == "SQLMailbox":
        from .sql import SQLMailbox

        return SQLMailbox
    raise AttributeError(f"module 'lattice_mailbox' has no attribute {name!r}")


__all__ = [
    "ACCEPTED_SCHEMES",
    "ClaimError",
    "ClaimMissingError",
    "ClaimTakenError",
    "InvalidTransitionError",
    "LeasedMailbox",
    "MailboxError",
    "MemoryMailbox",
    "MessageStatus",
    "MessageTooLargeError",
    "RedisMailbox",
    "SQLMailbox",
    "TERMINAL_STATUSES",
    "TeamMailbox",
    "TeamMessage",
    "mailbox_from_url",
]
