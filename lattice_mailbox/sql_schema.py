"""The SQL mailbox's schema and statements (:mod:`lattice_mailbox.sql` runs them):
the two tables, the columns a table made by an earlier release gets added,
the hot statements built once, and rows read back as messages."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    bindparam,
    func,
    inspect,
    select,
    text,
    update,
)
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Row

from .message import MessageStatus, TeamMessage
from .urls import mask_url

S = MessageStatus

_DRIVERS = {
    "sqlite": "sqlite",
    "sqlite+pysqlite": "sqlite",
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "postgresql+psycopg": "postgresql+psycopg",
}


def normalize_url(url: str) -> str:
    """Map ``postgresql://`` / ``postgres://`` to the psycopg 3 driver; accept
    ``sqlite://...`` as is. Raises ``ValueError`` for any other scheme."""
    if not isinstance(url, str):
        raise TypeError(f"SQL mailbox URL must be a str, not {type(url).__name__}")
    scheme, sep, rest = url.partition("://")
    driver = _DRIVERS.get(scheme.lower())
    if not sep or driver is None:
        raise ValueError(
            f"unsupported SQL mailbox URL {mask_url(url)!r}; expected sqlite:///path, postgresql://... "
            "or postgresql+psycopg://..."
        )
    return f"{driver}://{rest}"


def _tables(prefix: str) -> tuple[MetaData, Table, Table]:
    md = MetaData()
    messages = Table(
        f"{prefix}messages",
        md,
        Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
        Column("id", String(64), nullable=False, unique=True),
        Column("mailbox", Text, nullable=False),
        Column("sender", Text, nullable=False),
        Column("content", Text, nullable=False),
        Column("status", String(16), nullable=False),
        Column("created_at", BigInteger, nullable=False),
        Column("thread_id", Text),
        Column("work_item_id", Text),
        Column("reply_to", Text),
        Column("meta", Text, nullable=False),
        Column("claimed_by", Text),
        Column("lease_until", BigInteger),
        Column("attempts", Integer, nullable=False, default=0),
        Column("fence", String(64)),
        # claims whose lease expired (requeue_expired's max_attempts counts these); added
        # to a table made before it by _ensure (ALTER TABLE ... ADD COLUMN)
        Column("expired", Integer, nullable=False, default=0, server_default=text("0")),
        Index(f"{prefix}ix_box_status_seq", "mailbox", "status", "seq"),
        Index(f"{prefix}ix_status_lease", "status", "lease_until"),
    )
    mailboxes = Table(f"{prefix}mailboxes", md, Column("id", Text, primary_key=True))
    return md, messages, mailboxes


def _add_missing_columns(conn: Connection, table: Table) -> None:
    """Add to ``table`` the columns a table made by an earlier release lacks
    (each has a server default, so its rows stay valid)."""
    present = {c["name"] for c in inspect(conn).get_columns(table.name)}
    for column in table.columns:
        if column.name not in present:
            kind = column.type.compile(dialect=conn.dialect)
            default = column.server_default.arg.text  # type: ignore[union-attr]
            conn.execute(
                text(
                    f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind} NOT NULL DEFAULT {default}'
                )
            )


class _Statements:
    """The hot statements, built once with bind parameters (``p_*``) so each
    call skips statement construction and cache-key generation."""

    def __init__(self, messages: Table, mailboxes: Table, *, sqlite: bool) -> None:
        t, boxes = messages, mailboxes
        box, mid, token = bindparam("p_box"), bindparam("p_id"), bindparam("p_token")
        pending, processing = S.PENDING.value, S.PROCESSING.value
        dialect = sqlite_dialect if sqlite else pg_dialect
        holds = (t.c.id == mid, t.c.status == processing, t.c.fence == token)
        self.register = dialect.insert(boxes).values(id=box).on_conflict_do_nothing()
        # an id stored already is not an error: the send waits for an unfinished insert of that
        # id (a lost call still committing) and then writes nothing; the caller reads the row
        self.insert = dialect.insert(t).on_conflict_do_nothing(index_elements=[t.c.id]).returning(t.c.seq)
        self.has_pending = select(t.c.seq).where(t.c.mailbox == box, t.c.status == pending).limit(1)
        self.lock_box = select(boxes.c.id).where(boxes.c.id == box).with_for_update()
        self.in_flight = (
            select(func.count())
            .select_from(t)
            .where(t.c.mailbox == box, t.c.status.in_([processing, S.PARKED.value]))
        )
        oldest = (
            select(t.c.seq)
            .where(t.c.mailbox == box, t.c.status == pending)
            .order_by(t.c.seq)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        claimed = {
            "status": processing,
            "attempts": t.c.attempts + 1,
            "claimed_by": bindparam("p_worker"),
            "lease_until": bindparam("p_lease"),
            "fence": token,
        }
        # PostgreSQL: a claim holds the advisory lock of its token until it ends, so the
        # lookup of a lost claim (claim_lock first) waits for a COMMIT still running
        held = () if sqlite else (func.pg_try_advisory_xact_lock(bindparam("p_lock")),)
        self.claim = update(t).where(t.c.seq == oldest, *held).values(**claimed).returning(*t.c)
        self.claim_id = (
            update(t)
            .where(t.c.id == mid, t.c.mailbox == box, t.c.status == pending, *held)
            .values(**claimed)
            .returning(*t.c)
        )
        self.claim_lock = select(func.pg_advisory_xact_lock(bindparam("p_lock")))
        self.move = (
            update(t)
            .where(t.c.id == mid, t.c.status.in_(bindparam("p_sources", expanding=True)))
            .values(status=bindparam("p_status"), claimed_by=None, lease_until=None, fence=None)
        )
        self.complete = (
            update(t)
            .where(*holds)
            .values(status=bindparam("p_status"), claimed_by=None, lease_until=None)
            .returning(*t.c)
        )
        self.extend = update(t).where(*holds).values(lease_until=bindparam("p_lease"))
        self.status_of = select(t.c.status).where(t.c.id == mid)
        self.row_of = select(t).where(t.c.id == mid)
        self.claim_of = select(t).where(t.c.mailbox == box, t.c.status == processing, t.c.fence == token)
        self.counts = select(t.c.status, func.count()).where(t.c.mailbox == box).group_by(t.c.status)


def _message(row: Row[Any], *, claim_token: str | None = None) -> TeamMessage:
    return TeamMessage(
        id=row.id,
        from_=row.sender,
        to=row.mailbox,
        content=row.content,
        status=row.status,
        created_at=row.created_at,
        thread_id=row.thread_id,
        work_item_id=row.work_item_id,
        reply_to=row.reply_to,
        metadata=json.loads(row.meta),
        claimed_by=row.claimed_by,
        lease_until=row.lease_until,
        attempts=row.attempts,
        claim_token=claim_token,
    )
