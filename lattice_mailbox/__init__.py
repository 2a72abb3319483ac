"""lattice_mailbox: the ``TeamMailbox`` protocol and its stores.

Design: docs/architecture.md
("Core model", "Lua scripts and Redis keys").
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

import hashlib
import re
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
from .urls import mask_url

if TYPE_CHECKING:
    from .redis import RedisMailbox
    from .sql import SQLMailbox

_REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
_SQL_SCHEMES = ("sqlite", "postgresql", "postgres", "postgresql+psycopg")
ACCEPTED_SCHEMES = (
    "memory://",
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "sqlite:///path",
    "postgresql://",
    "postgresql+psycopg://",
)


_SQL_SAFE = re.compile(r"[a-z_][a-z0-9_]*")
_SQL_UNSAFE_CHAR = re.compile(r"[^a-z0-9_]")
_SQL_MAX_PREFIX = 41  # SQLMailbox's bound: PostgreSQL identifiers stop at 63 bytes (prefix + index suffix)


def sql_table_prefix(key_prefix: str) -> str:
    """The SQL table prefix :func:`mailbox_from_url` derives from a key prefix.

    A key prefix that is already a safe SQL name (``[a-z_][a-z0-9_]*``, at most
    40 characters) maps to itself plus ``"_"``: ``"lattice"`` -> ``"lattice_"``
    (the tables ``lattice_messages`` / ``lattice_mailboxes``, as before). Any
    other is lowercased, every character outside ``[a-z0-9_]`` becomes ``"_"``,
    and 8 hex digits of the SHA-256 of the original are appended, so prefixes
    that differ only in case or punctuation (``"Staging"`` / ``"staging"``,
    ``"a.b"`` / ``"a-b"``) still get their own tables:
    ``"test-1"`` -> ``"test_1_<8 hex>_"``. The result is at most 41 characters
    (what :class:`SQLMailbox` accepts as ``table_prefix``).

    Raises ``TypeError`` when ``key_prefix`` is not a str and ``ValueError``
    when it is empty.
    """
    if not isinstance(key_prefix, str):
        raise TypeError(f"key prefix must be a str, not {type(key_prefix).__name__}")
    if not key_prefix:
        raise ValueError("key prefix must be non-empty")
    if _SQL_SAFE.fullmatch(key_prefix) and len(key_prefix) < _SQL_MAX_PREFIX:
        return f"{key_prefix}_"
    digest = hashlib.sha256(key_prefix.encode("utf-8")).hexdigest()[:8]
    safe = _SQL_UNSAFE_CHAR.sub("_", key_prefix.lower())
    if not _SQL_SAFE.match(safe):  # starts with a digit
        safe = f"_{safe}"
    safe = safe[: _SQL_MAX_PREFIX - len(digest) - 2]
    return f"{safe}_{digest}_"


def mailbox_from_url(
    url: str,
    *,
    prefix: str | None = None,
    max_message_bytes: int | None = None,
    **kwargs: Any,
) -> MemoryMailbox | RedisMailbox | SQLMailbox:
    """Build a store from a URL, isolated by ``prefix`` and bounded by ``max_message_bytes``.

    ``prefix``: the deployment's key prefix (``LATTICE_KEY_PREFIX``); two
    prefixes on one Redis or one database never see each other's mailboxes.
    ``max_message_bytes``: the bound on content + metadata JSON, in **bytes**
    (``LATTICE_MAX_MESSAGE_BYTES``). Both apply to every store; ``None`` keeps
    the store's default (key prefix ``lattice``, 1 MiB). Other keyword
    arguments go to the store's constructor.

    * ``memory://`` -> :class:`MemoryMailbox` (``max_message_bytes``; ``prefix``
      is accepted and has nothing to separate: the store lives in this one object)
    * ``redis://...``, ``rediss://...``, ``unix://...`` -> :class:`RedisMailbox`
      (every key starts with ``"<prefix>:"``); ``redis+cluster://h:p[,h:p...]``
      -> :class:`RedisMailbox` on a Redis Cluster (redis-py's ``RedisCluster``)
    * ``sqlite:///path``, ``postgresql://...``, ``postgres://...``,
      ``postgresql+psycopg://...`` -> :class:`SQLMailbox` with
      ``table_prefix=sql_table_prefix(prefix)`` (tables ``<table_prefix>messages``
      and ``<table_prefix>mailboxes``; see :func:`sql_table_prefix`). A
      ``table_prefix`` keyword names the tables directly instead (not together
      with ``prefix``).

    Raises ``ValueError`` naming the accepted schemes for anything else, for
    an empty prefix, a non-positive ``max_message_bytes``, or both ``prefix``
    and ``table_prefix``; ``TypeError`` when ``url`` or ``prefix`` is not a string;
    ``ImportError`` naming the extra to install when a SQL store's packages are
    missing (``agent-lattice[sql]`` for SQLite, ``agent-lattice[postgres]`` for
    PostgreSQL, which also needs the psycopg driver). Messages show URLs
    through :func:`mask_url` (no password).
    """
    if not isinstance(url, str):
        raise TypeError(f"mailbox URL must be a str, not {type(url).__name__}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if prefix is not None and not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, not {type(prefix).__name__}")
    if prefix == "":
        raise ValueError("prefix must be non-empty")
    if max_message_bytes is not None:
        kwargs["max_message_bytes"] = max_message_bytes
    if sep and scheme == "memory":
        return MemoryMailbox(**kwargs)
    if sep and scheme in _REDIS_SCHEMES:
        from .redis import RedisMailbox

        if prefix is not None:
            kwargs["prefix"] = prefix
        return RedisMailbox(url, **kwargs)
    if sep and scheme in _SQL_SCHEMES:
        try:
            from .sql import SQLMailbox
        except ImportError as exc:
            extra = "sql" if scheme == "sqlite" else "postgres"
            raise ImportError(
                f"a {scheme}:// mailbox needs SQLAlchemy (pip install 'agent-lattice[{extra}]'): {exc}"
            ) from exc

        if prefix is not None:
            if "table_prefix" in kwargs:
                raise ValueError(
                    "give prefix (the key prefix, from which the table prefix is derived) or "
                    f"table_prefix, not both (prefix={prefix!r}, table_prefix={kwargs['table_prefix']!r})"
                )
            kwargs["table_prefix"] = sql_table_prefix(prefix)
        return SQLMailbox(url, **kwargs)
    raise ValueError(
        f"unsupported mailbox URL {mask_url(url)!r}; accepted schemes: {', '.join(ACCEPTED_SCHEMES)}"
    )


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
    "mask_url",
    "sql_table_prefix",
]
