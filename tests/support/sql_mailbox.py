"""Clean-up of a test's SQL mailbox: its two tables dropped, its pool closed."""

from __future__ import annotations

import asyncio

from sqlalchemy import text

from lattice_mailbox.sql import SQLMailbox


async def drop_sql_mailbox(mb: SQLMailbox) -> None:
    """Drop ``<table_prefix>messages`` and ``<table_prefix>mailboxes`` and close ``mb``."""

    def drop() -> None:
        with mb.engine.begin() as conn:
            p = mb.table_prefix
            conn.execute(text(f"DROP TABLE IF EXISTS {p}messages, {p}mailboxes"))

    await asyncio.to_thread(drop)
    await mb.aclose()


__all__ = ["drop_sql_mailbox"]
