"""The PostgreSQL mailbox decides a call whose connection was lost by its own ids.

Each test puts ``tests/support/cutting_proxy.py`` between the store and the
tests' PostgreSQL (``LATTICE_TEST_PG_URL``) and loses the reply of the next
``COMMIT``: the server commits, the store's connection is closed before it
hears so. As on Redis (docs/contracts.md, "Connections"), the call must then
return what did happen: one message stored, one claim made, the finish
replayed. With ``early=True`` the proxy closes the store's connection as soon
as the ``COMMIT`` is forwarded, and a deferred trigger (:func:`hook_commits`)
holds that ``COMMIT`` open a while: the lookup of the lost call must wait for
it, not act past it. Tables get a unique prefix per test and are dropped after.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from lattice_mailbox import MessageStatus
from lattice_mailbox.sql import SQLMailbox
from tests.support.cutting_proxy import CuttingProxy
from tests.support.services import PG_URL
from tests.support.sql_mailbox import drop_sql_mailbox

pytestmark = pytest.mark.postgres

COMMIT = b"COMMIT"
SLOW_S = 0.3  # how long a hooked COMMIT runs: far longer than a reconnect and a lookup


def hook_commits(mb: SQLMailbox) -> None:
    """A deferred trigger on ``mb``'s messages, run by the ``COMMIT`` of a row written
    with content ``slow`` (sleeps :data:`SLOW_S`) or ``refused`` (raises a
    serialization failure: an error that is not a lost connection)."""
    p = mb.table_prefix
    with mb.engine.begin() as conn:
        conn.execute(
            text(
                f"""CREATE FUNCTION {p}commit_hook() RETURNS trigger AS $$
                BEGIN
                  IF NEW.content = 'slow' THEN PERFORM pg_sleep({SLOW_S}); END IF;
                  IF NEW.content = 'refused' THEN
                    RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'serialization_failure';
                  END IF;
                  RETURN NULL;
                END $$ LANGUAGE plpgsql"""
            )
        )
        conn.execute(
            text(
                f"CREATE CONSTRAINT TRIGGER {p}commit_hook AFTER INSERT OR UPDATE ON {p}messages "
                f"DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {p}commit_hook()"
            )
        )


@pytest.fixture
async def cut() -> AsyncIterator[tuple[SQLMailbox, CuttingProxy]]:
    """A mailbox on the tests' PostgreSQL through a :class:`CuttingProxy`; its tables exist already."""
    pg = make_url(PG_URL)
    with CuttingProxy(pg.port or 5432, pg.host or "127.0.0.1") as proxy:
        url = pg.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
        mb = SQLMailbox(url, table_prefix=f"t{uuid.uuid4().hex[:12]}_")
        await mb.counts("t::w")  # creates the tables: the next COMMIT is the test's call
        try:
            yield mb, proxy
        finally:

            def drop_hook() -> None:
                with mb.engine.begin() as conn:
                    conn.execute(text(f"DROP FUNCTION IF EXISTS {mb.table_prefix}commit_hook() CASCADE"))

            await asyncio.to_thread(drop_hook)
            await drop_sql_mailbox(mb)


async def test_a_complete_whose_commit_reply_was_lost_returns_the_finish_that_happened(cut):
    mb, proxy = cut
    await mb.send("t::lead", "t::w", "job")
    claim = await mb.claim_next("t::w", lease_s=30)
    proxy.cut_reply_of(COMMIT)
    done = await mb.complete(claim.id, claim.claim_token, "done")
    assert proxy.cuts == 1
    assert (done.id, done.status) == (claim.id, MessageStatus.DONE)
    stored = await mb.get(claim.id)
    assert stored is not None and stored.status is MessageStatus.DONE
    assert stored.attempts == 1


async def test_a_send_whose_commit_reply_was_lost_is_stored_once(cut):
    mb, proxy = cut
    await mb.send("t::lead", "t::w", "warm-up")
    proxy.cut_reply_of(COMMIT)
    sent = await mb.send("t::lead", "t::w", "lost")
    assert proxy.cuts == 1
    assert [(m.id, m.content) for m in await mb.inbox("t::w", "all")][1:] == [(sent.id, "lost")]


async def test_a_claim_whose_commit_reply_was_lost_is_found_by_its_token_not_made_twice(cut):
    mb, proxy = cut
    first = await mb.send("t::lead", "t::w", "first")
    second = await mb.send("t::lead", "t::w", "second")
    proxy.cut_reply_of(COMMIT)
    claim = await mb.claim_next("t::w", lease_s=30, worker_id="w1")
    assert proxy.cuts == 1
    assert claim is not None and claim.id == first.id and claim.attempts == 1
    assert [m.id for m in await mb.inbox("t::w", "processing")] == [first.id]
    assert [m.id for m in await mb.inbox("t::w", "pending")] == [second.id]
    # the token returned is the one the stored claim holds
    assert (await mb.complete(claim.id, claim.claim_token, "done")).status is MessageStatus.DONE


async def test_a_lease_extension_whose_commit_reply_was_lost_is_made_again(cut):
    mb, proxy = cut
    await mb.send("t::lead", "t::w", "job")
    claim = await mb.claim_next("t::w", lease_s=5)
    proxy.cut_reply_of(COMMIT)
    until = await mb.extend_lease(claim.id, claim.claim_token, 60)
    assert proxy.cuts == 1
    stored = await mb.get(claim.id)
    assert stored is not None and stored.lease_until == until
    assert until > claim.lease_until + 50_000


async def test_a_pooled_connection_the_server_ended_is_replaced_for_the_next_finish(cut):
    mb, _ = cut
    await mb.send("t::lead", "t::w", "job")
    claim = await mb.claim_next("t::w", lease_s=30)

    def end_backends() -> None:  # as a server restart or an idle timeout would
        with mb.engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        direct = SQLMailbox(PG_URL, table_prefix=mb.table_prefix)
        with direct.engine.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        direct.engine.dispose()

    await asyncio.to_thread(end_backends)
    done = await mb.complete(claim.id, claim.claim_token, "done")
    assert done.status is MessageStatus.DONE


async def test_a_claim_lost_while_its_commit_still_runs_is_waited_for_not_made_twice(cut):
    mb, proxy = cut
    await asyncio.to_thread(hook_commits, mb)
    first = await mb.send("t::lead", "t::w", "slow")
    second = await mb.send("t::lead", "t::w", "second")
    proxy.cut_reply_of(COMMIT, early=True)  # closed at once; the COMMIT runs SLOW_S more
    claim = await mb.claim_next("t::w")  # no lease: a second claim would hold a message for ever
    assert proxy.cuts == 1
    assert claim is not None and claim.id == first.id and claim.attempts == 1
    assert [m.id for m in await mb.inbox("t::w", "processing")] == [first.id]
    assert [m.id for m in await mb.inbox("t::w", "pending")] == [second.id]


async def test_a_send_lost_while_its_commit_still_runs_returns_the_message_stored_once(cut):
    mb, proxy = cut
    await asyncio.to_thread(hook_commits, mb)
    await mb.send("t::lead", "t::w", "warm-up")
    proxy.cut_reply_of(COMMIT, early=True)
    sent = await mb.send("t::lead", "t::w", "slow")  # its second insert finds the id stored
    assert proxy.cuts == 1
    assert [(m.id, m.content) for m in await mb.inbox("t::w", "all")][1:] == [(sent.id, "slow")]


async def test_an_error_that_is_not_a_lost_connection_is_raised_after_one_try(cut):
    mb, _ = cut
    await asyncio.to_thread(hook_commits, mb)
    inserts: list[str] = []

    @event.listens_for(mb.engine, "before_cursor_execute")
    def count(_conn, _cursor, statement, *_args) -> None:
        if statement.lstrip().upper().startswith(f"INSERT INTO {mb.table_prefix.upper()}MESSAGES"):
            inserts.append(statement)

    with pytest.raises(DBAPIError) as raised:
        await mb.send("t::lead", "t::w", "refused")
    assert not raised.value.connection_invalidated
    assert len(inserts) == 1
    assert await mb.inbox("t::w", "all") == []


async def test_sends_racing_under_one_dedup_key_return_the_one_message_stored(cut):
    mb, _ = cut
    await asyncio.to_thread(hook_commits, mb)
    await mb.send("t::lead", "t::w", "warm-up")
    first = asyncio.create_task(mb.send("t::lead", "t::w", "slow", dedup_key="k"))
    await asyncio.sleep(SLOW_S / 3)  # the first one's COMMIT is running: the second does not see it
    second = await mb.send("t::lead", "t::w", "other", dedup_key="k")
    first_sent = await first
    assert (second.id, second.content) == (first_sent.id, first_sent.content)
    assert [m.content for m in await mb.inbox("t::w", "all")][1:] == [first_sent.content]
