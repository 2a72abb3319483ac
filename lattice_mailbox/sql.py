"""``SQLMailbox``: the durable mailbox store on SQLAlchemy (SQLite or PostgreSQL).

Mailbox semantics: docs/architecture.md, "Core model"; leases
and fencing from docs/architecture.md.

* ``sqlite:///path/to/file.db`` (default driver ``sqlite3``, WAL journal).
  Every write runs in ``BEGIN IMMEDIATE`` (one writer at a time; others wait
  up to ``busy_timeout_s``), so ``claim_next`` is atomic across processes.
  ``sqlite://`` (in memory) works within one process.
* ``postgresql://...`` (mapped to the psycopg 3 driver) or
  ``postgresql+psycopg://...``. ``claim_next`` picks the oldest pending row with
  ``SELECT ... FOR UPDATE SKIP LOCKED`` so concurrent claimers never wait on
  each other; with ``max_in_flight`` it first locks the mailbox's registry row,
  so claims that pass a limit are serial per mailbox (claims without a limit
  do not take that lock and are not counted against it until they commit).

Two tables, created on first use (``<table_prefix>messages``,
``<table_prefix>mailboxes``); ``table_prefix`` (default ``lattice_``) lets
several deployments or test runs share one database. ``seq`` (an
auto-increment key) is the send order. Times are milliseconds since the epoch
from the caller's clock; ``lease_s`` is in seconds. The engine is synchronous;
each call runs in a worker thread (``asyncio.to_thread``).

A call whose connection is lost (SQLAlchemy's ``DBAPIError`` with
``connection_invalidated``: the server closed it, a proxy cut it, or the reply
of its ``COMMIT`` never came, so whether it committed is unknown) is decided by
its own ids, as on Redis (docs/contracts.md, "Connections"): ``send`` looks for
its message id and sends again only when the row is absent (an insert of an id
stored already writes nothing, after waiting for an unfinished one); ``claim_next``
looks for the row its claim token holds (returned when found, claimed again
when not; on PostgreSQL each claim holds an advisory lock of its token, and the
lookup waits for it, so a ``COMMIT`` still running is seen); ``complete`` and ``extend_lease`` are sent again with the same token
(a finish that did commit is replayed, a second extension is harmless); the
reads are read again. Each is tried at most :data:`LOST_CALL_ATTEMPTS` times;
``update_status`` and ``requeue_expired`` raise the error and the caller
decides. A failed connect is not a lost call: it raises at once.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import (
    Connection,
    create_engine,
    event,
    select,
    text,
    update,
)
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import StaticPool

from .base import ClaimMissingError, ClaimTakenError
from .message import MessageStatus, TeamMessage
from .sql_schema import _add_missing_columns, _message, _Statements, _tables, normalize_url
from .transitions import check_transition, only_from_set, sources_for
from .urls import mask_url
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
T = TypeVar("T")
_PREFIX = re.compile(r"[a-z_][a-z0-9_]{0,40}")
_REQUEUE_BATCH = 500

LOST_CALL_ATTEMPTS = 3
"""How many times a call whose connection was lost is made (see the module doc)."""

LOST_CLAIM_WAIT_S = 10
"""PostgreSQL: how long (seconds) the lookup of a lost claim waits for that
claim's transaction to end (its ``COMMIT`` may still be running); past it the
lookup raises SQLAlchemy's ``OperationalError`` (lock timeout)."""


class SQLMailbox(CheckedSend):
    """SQL :class:`~lattice_mailbox.base.LeasedMailbox` (see the module docstring).

    ``url``: ``sqlite:///path``, ``sqlite://`` (memory), ``postgresql://...`` or
    ``postgresql+psycopg://...``. ``table_prefix``: lowercase letters, digits and
    ``_`` (default ``"lattice_"``). ``max_message_bytes`` bounds content +
    metadata JSON (bytes, default 1 MiB). ``busy_timeout_s``: how long a SQLite
    writer waits for the lock (seconds). Extra keyword arguments go to
    ``sqlalchemy.create_engine``. Database failures raise SQLAlchemy errors.
    """

    def __init__(
        self,
        url: str,
        *,
        table_prefix: str = "lattice_",
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        busy_timeout_s: float = 30.0,
        **engine_kwargs: Any,
    ) -> None:
        if not isinstance(table_prefix, str) or not _PREFIX.fullmatch(table_prefix):
            raise ValueError(
                f"table_prefix must match {_PREFIX.pattern} (lowercase letters, digits, _), got {table_prefix!r}"
            )
        self.url = normalize_url(url)
        self.table_prefix = table_prefix
        self.max_message_bytes = check_max_message_bytes(max_message_bytes)
        self._metadata, self._messages, self._mailboxes = _tables(table_prefix)
        self._ready = False
        self._registered: set[str] = set()
        self._ddl_lock = threading.Lock()
        self._serial: threading.Lock | None = None
        self.engine = self._make_engine(busy_timeout_s, engine_kwargs)
        self._q = _Statements(self._messages, self._mailboxes, sqlite=self._sqlite)

    def __repr__(self) -> str:
        return f"SQLMailbox(url={mask_url(self.url)!r}, table_prefix={self.table_prefix!r})"

    def _make_engine(self, busy_timeout_s: float, kwargs: dict[str, Any]) -> Engine:
        parsed = make_url(self.url)
        self._sqlite = parsed.get_backend_name() == "sqlite"
        if not self._sqlite:
            if parsed.get_driver_name() == "psycopg" and importlib.util.find_spec("psycopg") is None:
                raise ImportError(
                    "a postgresql:// mailbox needs the psycopg driver: pip install 'agent-lattice[postgres]'"
                )
            return create_engine(parsed, **kwargs)
        in_memory = parsed.database in (None, "", ":memory:")
        connect_args = dict(kwargs.pop("connect_args", {}))
        connect_args.setdefault("timeout", busy_timeout_s)
        if in_memory:
            connect_args["check_same_thread"] = False
            kwargs.setdefault("poolclass", StaticPool)
            self._serial = threading.Lock()  # one shared connection: one call at a time
        engine = create_engine(parsed, connect_args=connect_args, **kwargs)
        busy_ms = int(busy_timeout_s * 1000)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # we emit BEGIN ourselves
            cursor = dbapi_connection.cursor()
            cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
            if not in_memory:
                cursor.execute("PRAGMA journal_mode = WAL")
                cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Connection) -> None:
            read_only = conn.get_execution_options().get("lattice_read_only", False)
            conn.exec_driver_sql("BEGIN" if read_only else "BEGIN IMMEDIATE")

        return engine

    # -- plumbing ------------------------------------------------------------------

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(self._run, fn, *args)

    async def _call_again(
        self, fn: Callable[..., T], *args: Any, find: Callable[[], T | None] | None = None
    ) -> T:
        """:meth:`_call` for a call that may be made again when its connection is
        lost: ``find`` (on a new connection) returns what a lost call did, or
        ``None`` when it did nothing; without ``find`` the call is simply made again."""
        return await asyncio.to_thread(self._run, _recovering, lambda: fn(*args), find)

    def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._serial is None:
            self._ensure()
            return fn(*args)
        with self._serial:
            self._ensure()
            return fn(*args)

    def _ensure(self) -> None:
        if self._ready:
            return
        with self._ddl_lock:
            if self._ready:
                return
            with self.engine.begin() as conn:
                if not self._sqlite:  # concurrent CREATE TABLE races on PostgreSQL's catalog
                    key = int.from_bytes(
                        hashlib.sha256(self.table_prefix.encode()).digest()[:8], "big", signed=True
                    )
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})
                self._metadata.create_all(conn)
                _add_missing_columns(conn, self._messages)
            self._ready = True

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.connect() as conn, conn.begin():
            yield conn

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self.engine.connect().execution_options(lattice_read_only=True) as conn, conn.begin():
            yield conn

    def _register(self, conn: Connection, mailbox_id: str) -> None:
        if mailbox_id not in self._registered:
            conn.execute(self._q.register, {"p_box": mailbox_id})

    # -- the five protocol methods -------------------------------------------------

    # ``send`` (argument checks) comes from CheckedSend; one transaction writes the message.

    async def _append(self, out: Outgoing) -> TeamMessage:
        message = out.new_message()  # its id is made once: a lost send is looked up by it
        return await self._call_again(self._send, out, message, find=lambda: self._get(message.id))

    def _send(self, out: Outgoing, message: TeamMessage) -> TeamMessage:
        if out.dedup_key is not None:
            earlier = self._get(message.id)
            if earlier is not None:  # sent before under this key
                return earlier
        with self._write() as conn:
            self._register(conn, out.to)
            inserted = conn.execute(
                self._q.insert,
                {
                    "id": message.id,
                    "mailbox": out.to,
                    "sender": out.from_,
                    "content": out.content,
                    "status": S.PENDING.value,
                    "created_at": message.created_at,
                    "thread_id": message.thread_id,
                    "work_item_id": out.work_item_id,
                    "reply_to": out.reply_to,
                    "meta": out.metadata_json,
                    "attempts": 0,
                },
            ).first()
            if inserted is None:  # stored already: by a lost call of this send, or under this dedup key
                message = _message(conn.execute(self._q.row_of, {"p_id": message.id}).one())
        if len(self._registered) > 10_000:
            self._registered.clear()
        self._registered.add(out.to)  # committed: later sends skip the registry insert
        return message

    async def inbox(
        self, mailbox_id: str, status: MessageStatus | str = "pending", *, limit: int | None = None
    ) -> list[TeamMessage]:
        """Messages of ``mailbox_id`` with ``status`` (or ``"all"``), oldest first,
        at most ``limit``. Raises ``ValueError`` for an unknown status."""
        check_name(mailbox_id)
        wanted, limit = check_inbox(status, limit)
        return await self._call_again(self._inbox, mailbox_id, wanted, limit)

    def _inbox(self, mailbox_id: str, wanted: MessageStatus | None, limit: int | None) -> list[TeamMessage]:
        t = self._messages
        query = select(t).where(t.c.mailbox == mailbox_id)
        if wanted is not None:
            query = query.where(t.c.status == wanted.value)
        query = query.order_by(t.c.seq)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as conn:
            return [_message(row) for row in conn.execute(query)]

    async def get(self, message_id: str) -> TeamMessage | None:
        """The message with this id, or ``None``."""
        message_id_tag(message_id)  # type check
        return await self._call_again(self._get, message_id)

    def _get(self, message_id: str) -> TeamMessage | None:
        with self._read() as conn:
            row = conn.execute(self._q.row_of, {"p_id": message_id}).first()
        return None if row is None else _message(row)

    async def claim_next(
        self,
        mailbox_id: str,
        *,
        lease_s: float | None = None,
        worker_id: str | None = None,
        max_in_flight: int | None = None,
        message_id: str | None = None,
    ) -> TeamMessage | None:
        """Atomically move the oldest ``pending`` message of ``mailbox_id`` to
        ``processing`` and return it with a fresh ``claim_token``; ``None`` when
        nothing is pending or ``max_in_flight`` messages are in ``processing`` or ``parked``.
        ``lease_s`` (seconds) sets ``lease_until`` (ms); without it the claim never
        expires. ``attempts`` counts claims. ``message_id``: claim that message
        instead (``None`` when it is not pending in ``mailbox_id``). When the
        connection is lost mid-call, the message the claim token holds is
        returned; when none holds it, nothing was claimed and the claim is made
        again. On PostgreSQL the lookup first waits for the lost call's
        transaction to end (its ``COMMIT`` may still be running), at most
        :data:`LOST_CLAIM_WAIT_S`, then raises ``OperationalError``."""
        check_name(mailbox_id)
        ms, worker_id, max_in_flight = check_claim(lease_s, worker_id, max_in_flight)
        wanted = check_claim_id(message_id)
        token = new_token()
        return await self._call_again(
            self._claim,
            mailbox_id,
            ms,
            worker_id,
            max_in_flight,
            wanted,
            token,
            find=lambda: self._find_claim(mailbox_id, token),
        )

    def _claim(
        self,
        mailbox_id: str,
        ms: int | None,
        worker_id: str | None,
        max_in_flight: int | None,
        wanted: str,
        token: str,
    ) -> TeamMessage | None:
        q = self._q
        box = {"p_box": mailbox_id}
        if self._sqlite:
            with self._read() as conn:  # cheap WAL read: idle pollers never queue for the write lock
                if conn.execute(q.has_pending, box).first() is None:
                    return None
        with self._write() as conn:
            if max_in_flight is not None:
                if conn.execute(q.lock_box, box).first() is None:
                    return None
                if conn.execute(q.in_flight, box).scalar_one() >= max_in_flight:
                    return None
            params = {
                "p_box": mailbox_id,
                "p_worker": worker_id,
                "p_lease": None if ms is None else now_ms() + ms,
                "p_token": token,
                "p_id": wanted,
            }
            if not self._sqlite:
                params["p_lock"] = _lock_key(token)
            row = conn.execute(q.claim_id if wanted else q.claim, params).first()
        return None if row is None else _message(row, claim_token=token)

    def _find_claim(self, mailbox_id: str, token: str) -> TeamMessage | None:
        """The message of ``mailbox_id`` that claim ``token`` holds, or ``None``.
        PostgreSQL: first waits (at most :data:`LOST_CLAIM_WAIT_S`) for the claim's
        transaction to end, so a ``COMMIT`` still running is seen, not claimed past."""
        with self._read() as conn:
            if not self._sqlite:
                conn.exec_driver_sql(f"SET LOCAL lock_timeout = {LOST_CLAIM_WAIT_S * 1000}")
                conn.execute(self._q.claim_lock, {"p_lock": _lock_key(token)})
            # a statement after the wait: it reads a snapshot taken once the claim ended
            row = conn.execute(self._q.claim_of, {"p_box": mailbox_id, "p_token": token}).first()
        return None if row is None else _message(row, claim_token=token)

    async def update_status(
        self, message_id: str, status: MessageStatus | str, *, only_from: Any = None
    ) -> bool:
        """Set a message's status per :mod:`lattice_mailbox.transitions` (one
        transaction); ``only_from`` (a status or several): only from those (a
        compare-and-set). ``False`` for an unknown id; ``ValueError`` for an
        unknown status; :class:`InvalidTransitionError` for a refused move
        (nothing changes)."""
        target = MessageStatus.parse(status)
        allowed_from = only_from_set(only_from)
        message_id_tag(message_id)  # type check
        return await self._call(self._update_status, message_id, target, allowed_from)

    def _update_status(
        self, message_id: str, target: MessageStatus, only_from: frozenset[MessageStatus] | None = None
    ) -> bool:
        sources = [src.value for src in sources_for(target, only_from)]
        with self._write() as conn:
            # Leaving any state clears the claim fields (they are only set in
            # processing) and the recorded token of a fenced complete.
            if sources:
                params = {"p_id": message_id, "p_sources": sources, "p_status": target.value}
                if conn.execute(self._q.move, params).rowcount == 1:
                    return True
            current = conn.execute(self._q.status_of, {"p_id": message_id}).scalar()
        if current is None:
            return False
        check_transition(message_id, MessageStatus(current), target, only_from)  # raises unless a no-op
        return True

    # -- lease capability --------------------------------------------------------

    async def extend_lease(self, message_id: str, token: str, lease_s: float) -> int:
        """Push the lease to now + ``lease_s`` seconds; returns the new
        ``lease_until`` (ms). Raises :class:`ClaimTakenError` / :class:`ClaimMissingError`."""
        ms = check_extend(token, lease_s)
        message_id_tag(message_id)
        return await self._call_again(self._extend, message_id, token, ms)

    def _extend(self, message_id: str, token: str, ms: int) -> int:
        lease_until = now_ms() + ms
        with self._write() as conn:
            params = {"p_id": message_id, "p_token": token, "p_lease": lease_until}
            if conn.execute(self._q.extend, params).rowcount != 1:
                self._refuse(conn, message_id)
        return lease_until

    def _refuse(self, conn: Connection, message_id: str) -> None:
        """Raise the right claim error for a token that did not match."""
        if conn.execute(self._q.status_of, {"p_id": message_id}).scalar() == S.PROCESSING.value:
            raise ClaimTakenError(message_id)
        raise ClaimMissingError(message_id)

    async def complete(self, message_id: str, token: str, status: MessageStatus | str) -> TeamMessage:
        """Fenced ``update_status`` from ``processing`` (one transaction): only the
        holder of ``token`` may finish the claim; repeating the same successful
        call returns the message again. Raises ``ValueError`` (unknown status),
        :class:`InvalidTransitionError` (target ``processing``),
        :class:`ClaimTakenError` or :class:`ClaimMissingError`."""
        target, _ = check_complete(message_id, token, status)
        # sent again when its connection is lost: the same token and status again is a replay
        # of the finish that did commit (or the finish itself, when the lost call did not)
        return await self._call_again(self._complete, message_id, token, target)

    def _complete(self, message_id: str, token: str, target: MessageStatus) -> TeamMessage:
        with self._write() as conn:
            params = {"p_id": message_id, "p_token": token, "p_status": target.value}
            row = conn.execute(self._q.complete, params).first()
            if row is not None:
                return _message(row)
            row = conn.execute(self._q.row_of, {"p_id": message_id}).first()
            if row is not None and row.fence == token and row.status == target.value:
                return _message(row)  # replay of our own completion
            self._refuse(conn, message_id)
        raise AssertionError("unreachable")  # pragma: no cover

    async def requeue_expired(
        self, *, max_attempts: int | None = None, now_ms: int | None = None
    ) -> list[TeamMessage]:
        """Move every ``processing`` message whose ``lease_until`` <= now (ms)
        back to ``pending``, or to ``failed`` once its claims expired
        ``max_attempts`` times (see :meth:`LeasedMailbox.requeue_expired`);
        returns the moved messages with their new status (in batches of 500
        rows per transaction; rows another transaction holds are left for the
        next sweep on PostgreSQL)."""
        max_attempts, now = check_requeue(max_attempts, now_ms)
        return await self._call(self._requeue, max_attempts, now)

    def _requeue(self, max_attempts: int | None, now: int | None) -> list[TeamMessage]:
        t = self._messages
        moved: list[TeamMessage] = []
        while True:
            cutoff = now_ms() if now is None else now
            with self._write() as conn:
                rows = conn.execute(
                    select(t)
                    .where(
                        t.c.status == S.PROCESSING.value,
                        t.c.lease_until.is_not(None),
                        t.c.lease_until <= cutoff,
                    )
                    .order_by(t.c.seq)
                    .limit(_REQUEUE_BATCH)
                    .with_for_update(skip_locked=True)
                ).all()
                targets = [
                    S.FAILED if max_attempts is not None and row.expired + 1 >= max_attempts else S.PENDING
                    for row in rows
                ]
                for target in (S.PENDING, S.FAILED):
                    seqs = [row.seq for row, to in zip(rows, targets, strict=True) if to == target]
                    if seqs:
                        conn.execute(
                            update(t)
                            .where(t.c.seq.in_(seqs))
                            .values(
                                status=target.value,
                                claimed_by=None,
                                lease_until=None,
                                fence=None,
                                expired=t.c.expired + 1,
                            )
                        )
            for row, target in zip(rows, targets, strict=True):
                message = _message(row)
                message.status = target
                message.claimed_by = None
                message.lease_until = None
                moved.append(message)
            if len(rows) < _REQUEUE_BATCH:
                return moved

    # -- extras --------------------------------------------------------------------

    async def counts(self, mailbox_id: str) -> dict[str, int]:
        """Number of messages per status value (all statuses, zeros included):
        one indexed ``GROUP BY``."""
        check_name(mailbox_id)
        return await self._call_again(self._counts, mailbox_id)

    def _counts(self, mailbox_id: str) -> dict[str, int]:
        out = {s.value: 0 for s in S}
        with self._read() as conn:
            for status, n in conn.execute(self._q.counts, {"p_box": mailbox_id}):
                out[status] = int(n)
        return out

    async def mailbox_ids(self, prefix: str | None = None) -> list[str]:
        """Every mailbox id a message was sent to, sorted; only those starting
        with ``prefix`` when given."""
        check_prefix_filter(prefix)
        return await self._call_again(self._mailbox_ids, prefix)

    def _mailbox_ids(self, prefix: str | None) -> list[str]:
        boxes = self._mailboxes
        query = select(boxes.c.id)
        if prefix:
            query = query.where(boxes.c.id.startswith(prefix, autoescape=True))
        with self._read() as conn:
            return sorted(conn.execute(query).scalars())

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await asyncio.to_thread(self.engine.dispose)


def _lock_key(token: str) -> int:
    """The PostgreSQL advisory lock key (a signed 64-bit int) of claim ``token``."""
    return int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "big", signed=True)


def _recovering(call: Callable[[], T], find: Callable[[], T | None] | None) -> T:
    """``call()``, made again (at most :data:`LOST_CALL_ATTEMPTS` times in all)
    while its connection is lost, unless ``find()`` returns what the lost call did."""
    for attempt in range(1, LOST_CALL_ATTEMPTS + 1):
        try:
            return call()
        except DBAPIError as exc:
            if not exc.connection_invalidated or attempt == LOST_CALL_ATTEMPTS:
                raise
        if find is not None and (found := find()) is not None:
            return found
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["LOST_CALL_ATTEMPTS", "SQLMailbox", "normalize_url"]
