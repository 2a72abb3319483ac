"""``mailbox_from_url(url, prefix=..., max_message_bytes=...)`` isolates and bounds every store.

Two deployments (key prefixes) sharing one SQLite file, one PostgreSQL database
or one Redis never see each other's mailboxes; the size bound reaches every
store; the client and the workers build the same store from the same settings.
Real services: Redis on 127.0.0.1:6379, PostgreSQL on 127.0.0.1:5432 database
``test`` (tables dropped after), SQLite in a temp dir.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from lattice_mailbox import MemoryMailbox, MessageTooLargeError, mailbox_from_url, sql_table_prefix
from lattice_mailbox.redis import RedisMailbox
from lattice_mailbox.sql import SQLMailbox
from tests.support.services import PG_URL, REDIS_URL

SHARED = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
]


async def _drop(mb: Any) -> None:
    if isinstance(mb, SQLMailbox):
        from sqlalchemy import text

        def drop() -> None:
            with mb.engine.begin() as conn:
                p = mb.table_prefix
                conn.execute(text(f'DROP TABLE IF EXISTS "{p}messages", "{p}mailboxes"'))

        if not mb.url.startswith("sqlite"):
            await asyncio.to_thread(drop)
    elif isinstance(mb, RedisMailbox):
        client = mb.client()
        keys = [k async for k in client.scan_iter(match=f"{mb.prefix}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    await mb.aclose()


@pytest.fixture
async def open_store(tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """``open_store(kind, **kwargs)``: ``mailbox_from_url`` on one shared URL per kind."""
    made: list[Any] = []
    urls = {"sqlite": f"sqlite:///{tmp_path}/shared.db", "postgres": PG_URL, "redis": REDIS_URL}

    def open_(kind: str, **kwargs: Any) -> Any:
        mb = mailbox_from_url(urls[kind], **kwargs)
        made.append(mb)
        return mb

    yield open_
    for mb in reversed(made):
        await _drop(mb)


def _unique(label: str) -> str:
    return f"test-{label}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize("kind", SHARED)
async def test_two_key_prefixes_on_one_store_never_see_each_others_mailboxes(kind, open_store):
    a = open_store(kind, prefix=_unique("a"))
    b = open_store(kind, prefix=_unique("b"))
    sent = await a.send("demo::lead", "demo::searcher", "only for deployment a")
    assert [m.id for m in await a.inbox("demo::searcher")] == [sent.id]
    assert await b.inbox("demo::searcher") == []
    assert await b.inbox("demo::searcher", "all") == []
    assert await b.get(sent.id) is None
    assert await b.mailbox_ids() == []
    assert await b.claim_next("demo::searcher") is None
    assert await b.update_status(sent.id, "cancelled") is False
    # b's own message stays b's; a's is untouched by b's calls
    theirs = await b.send("demo::lead", "demo::searcher", "only for deployment b")
    assert [m.content for m in await b.inbox("demo::searcher")] == ["only for deployment b"]
    assert [m.content for m in await a.inbox("demo::searcher")] == ["only for deployment a"]
    assert await a.get(theirs.id) is None
    assert (await a.get(sent.id)).status.value == "pending"


async def test_sql_tables_are_named_from_the_key_prefix(open_store):
    a = open_store("sqlite", prefix="staging")
    b = open_store("sqlite", prefix="Staging")  # differs only in case: its own tables still
    c = open_store("sqlite", prefix="a.b-1")
    assert a.table_prefix == "staging_"
    assert b.table_prefix != a.table_prefix and b.table_prefix.startswith("staging_")
    assert c.table_prefix.startswith("a_b_1_")
    await b.send("x::lead", "x::m", "hello")
    assert await a.inbox("x::m") == []
    # the default prefix keeps the tables a deployment without LATTICE_KEY_PREFIX always had
    assert sql_table_prefix("lattice") == "lattice_"
    assert open_store("sqlite").table_prefix == "lattice_"
    assert open_store("sqlite", prefix="lattice").table_prefix == "lattice_"


def test_sql_table_prefix_is_always_a_valid_table_prefix_and_distinct_per_key_prefix():
    keys = ["lattice", "test-1", "test_1", "TEST_1", "1abc", "a" * 40, "a" * 41, "a" * 200, "é", "a.b", "a-b"]
    derived = [sql_table_prefix(k) for k in keys]
    assert len(set(derived)) == len(keys)
    for table_prefix in derived:
        SQLMailbox("sqlite://", table_prefix=table_prefix)  # accepted as is (raises otherwise)
    with pytest.raises(ValueError, match="non-empty"):
        sql_table_prefix("")
    with pytest.raises(TypeError):
        sql_table_prefix(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["memory", *SHARED])
async def test_max_message_bytes_reaches_every_store(kind, open_store):
    if kind == "memory":
        mb = mailbox_from_url("memory://", prefix="ignored", max_message_bytes=64)
        assert isinstance(mb, MemoryMailbox)
    else:
        mb = open_store(kind, prefix=_unique("size"), max_message_bytes=64)
    assert mb.max_message_bytes == 64
    with pytest.raises(MessageTooLargeError):
        await mb.send("demo::lead", "demo::searcher", "x" * 65)
    assert await mb.inbox("demo::searcher", "all") == []
    await mb.send("demo::lead", "demo::searcher", "small")


def test_bad_prefix_arguments_are_refused():
    with pytest.raises(ValueError, match="not both"):
        mailbox_from_url("sqlite://", prefix="a", table_prefix="b_")
    with pytest.raises(ValueError, match="non-empty"):
        mailbox_from_url("sqlite://", prefix="")
    with pytest.raises(TypeError, match="prefix must be a str"):
        mailbox_from_url("redis://127.0.0.1:6379/0", prefix=3)  # type: ignore[arg-type]
    assert mailbox_from_url("sqlite://", table_prefix="own_").table_prefix == "own_"


def test_the_client_and_the_workers_open_the_same_sql_tables(tmp_path):
    from lattice_client import LatticeClient, get_settings
    from lattice_worker.runtime.worker.process import make_mailbox

    settings = get_settings(
        broker_url=REDIS_URL,
        mailbox_url=f"sqlite:///{tmp_path}/m.db",
        key_prefix="test-staging",
        max_message_bytes=4096,
    )
    with LatticeClient(settings=settings) as client:
        mine = client.aio.mailbox
        worker = make_mailbox(settings)
        assert (mine.table_prefix, mine.max_message_bytes) == (worker.table_prefix, 4096)
        assert mine.table_prefix == sql_table_prefix("test-staging")
