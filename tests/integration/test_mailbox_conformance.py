"""One conformance suite for every mailbox store: memory, Redis, SQLite, PostgreSQL.

The five methods, FIFO claims, the state machine, leases, fencing and
max_in_flight (docs/architecture.md, "Core model").
Real services: Redis on 127.0.0.1:6379 (a unique key prefix per test, keys
deleted after), PostgreSQL on 127.0.0.1:5432 database ``test`` (unique table
prefix per test, tables dropped after), SQLite in a temp dir.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from lattice_mailbox import (
    ClaimMissingError,
    ClaimTakenError,
    InvalidTransitionError,
    MemoryMailbox,
    MessageStatus,
    MessageTooLargeError,
    TeamMailbox,
    mailbox_from_url,
)
from lattice_mailbox.redis import RedisMailbox
from lattice_mailbox.sql import SQLMailbox
from lattice_mailbox.validation import new_message_id
from tests.support.services import PG_URL, REDIS_URL
from tests.support.sql_mailbox import drop_sql_mailbox

BACKENDS = [
    pytest.param("memory", id="memory"),
    pytest.param("redis", id="redis", marks=pytest.mark.redis),
    pytest.param("cluster", id="redis-cluster", marks=pytest.mark.cluster),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]

ALL = [s.value for s in MessageStatus]
# The transition table, written out independently of lattice_mailbox.transitions.
ALLOWED = {
    "pending": {"done", "failed", "cancelled", "read", "parked"},
    "processing": {"pending", "done", "failed", "cancelled", "read", "parked"},
    "read": {"done", "failed", "cancelled"},
    "parked": {"pending", "done", "failed", "cancelled"},
    "done": set(),
    "failed": set(),
    "cancelled": set(),
}

Factory = Callable[..., Any]


@pytest.fixture
async def make_store(tmp_path, request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Any]]:
    """``make_store(kind, **kwargs)`` builds a store isolated to this test
    (``"cluster"``: on the session's Redis Cluster, started on first use)."""
    cleanups: list[Callable[[], Any]] = []

    def make(kind: str, **kwargs: Any) -> Any:
        if kind == "memory":
            return MemoryMailbox(**kwargs)
        if kind == "redis":
            prefix = f"test-{uuid.uuid4().hex}"
            mb = RedisMailbox(REDIS_URL, prefix=prefix, **kwargs)

            async def drop_redis() -> None:
                client = mb.client()
                keys = [k async for k in client.scan_iter(match=f"{prefix}:*", count=1000)]
                if keys:
                    await client.delete(*keys)
                await mb.aclose()

            cleanups.append(drop_redis)
            return mb
        if kind == "cluster":
            cluster = request.getfixturevalue("redis_cluster")
            prefix = f"test-{uuid.uuid4().hex}"
            mb = RedisMailbox(cluster.url, prefix=prefix, **kwargs)

            async def drop_cluster() -> None:
                await mb.aclose()
                cluster.delete_prefix(f"{prefix}:")

            cleanups.append(drop_cluster)
            return mb
        if kind == "sqlite":
            mb = SQLMailbox(f"sqlite:///{tmp_path}/mailbox-{uuid.uuid4().hex[:6]}.db", **kwargs)
            cleanups.append(mb.aclose)
            return mb
        if kind == "postgres":
            kwargs.setdefault("table_prefix", f"t{uuid.uuid4().hex[:12]}_")
            mb = SQLMailbox(PG_URL, **kwargs)
            cleanups.append(lambda: drop_sql_mailbox(mb))
            return mb
        raise AssertionError(kind)

    yield make
    for cleanup in reversed(cleanups):
        await cleanup()


@pytest.fixture(params=BACKENDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def store(kind: str, make_store: Factory) -> Any:
    return make_store(kind)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


async def statuses(mb: Any, box: str) -> list[tuple[str, str]]:
    return [(m.content, m.status.value) for m in await mb.inbox(box, "all")]


# --------------------------------------------------------------------------- the five methods


async def test_every_store_satisfies_the_protocol(store):
    assert isinstance(store, TeamMailbox)


async def test_send_returns_a_pending_message_and_get_reads_it_back(store):
    before = now_ms()
    m = await store.send(
        "team::lead",
        "team::coder",
        "write the parser",
        work_item_id="wi-1",
        metadata={"kind": "handoff", "n": [1, 2], "é": "ü"},
    )
    after = now_ms()
    assert m.status == MessageStatus.PENDING
    assert (m.from_, m.to, m.content, m.work_item_id) == (
        "team::lead",
        "team::coder",
        "write the parser",
        "wi-1",
    )
    assert m.thread_id == m.id  # thread defaults to the message's own id
    assert m.reply_to is None and m.claimed_by is None and m.lease_until is None and m.attempts == 0
    assert m.claim_token is None
    assert before - 5 <= m.created_at <= after + 5  # milliseconds since the epoch
    assert m.metadata == {"kind": "handoff", "n": [1, 2], "é": "ü"}
    assert m.to_json_dict()["from"] == "team::lead"

    assert await store.get(m.id) == m
    reply = await store.send("team::coder", "team::lead", "done", thread_id=m.thread_id, reply_to=m.id)
    got = await store.get(reply.id)
    assert got is not None and got.thread_id == m.id and got.reply_to == m.id and got.metadata == {}
    assert await store.get("0123456789abcdef-" + "0" * 32) is None
    assert await store.get("not-an-id") is None


async def test_a_send_with_a_dedup_key_is_stored_once(store):
    """A tool call run again after a crash sends with the same key: the first message comes back."""
    first = await store.send("team::lead", "team::coder", "do it", dedup_key="session:toolu_1")
    await store.claim_next("team::coder")  # it moved on before the re-run
    again = await store.send("team::lead", "team::coder", "do it", dedup_key="session:toolu_1")
    assert again.id == first.id and again.status == MessageStatus.PROCESSING
    assert [m.id for m in await store.inbox("team::coder", "all")] == [first.id]
    other_key = await store.send("team::lead", "team::coder", "do it", dedup_key="session:toolu_2")
    other_box = await store.send("team::lead", "team::other", "do it", dedup_key="session:toolu_1")
    plain = await store.send("team::lead", "team::coder", "do it")
    assert len({first.id, other_key.id, other_box.id, plain.id}) == 4
    with pytest.raises(ValueError, match="dedup_key"):
        await store.send("team::lead", "team::coder", "x", dedup_key="")
    assert len(await store.inbox("team::coder", "all")) == 3


async def test_inbox_is_per_mailbox_oldest_first_with_status_filter_and_limit(store):
    sent = []
    for i in range(5):
        sent.append(await store.send("t::lead", "t::a", f"a{i}"))
        await store.send("t::lead", "t::b", f"b{i}")
    assert [m.content for m in await store.inbox("t::a")] == ["a0", "a1", "a2", "a3", "a4"]
    assert [m.content for m in await store.inbox("t::b", limit=2)] == ["b0", "b1"]
    assert await store.update_status(sent[1].id, "read")
    assert await store.update_status(sent[3].id, MessageStatus.CANCELLED)
    assert [m.content for m in await store.inbox("t::a")] == ["a0", "a2", "a4"]
    assert [m.content for m in await store.inbox("t::a", "read")] == ["a1"]
    assert [m.content for m in await store.inbox("t::a", MessageStatus.CANCELLED)] == ["a3"]
    assert await statuses(store, "t::a") == [
        ("a0", "pending"),
        ("a1", "read"),
        ("a2", "pending"),
        ("a3", "cancelled"),
        ("a4", "pending"),
    ]
    assert [m.content for m in await store.inbox("t::a", "all", limit=2)] == ["a0", "a1"]
    assert await store.inbox("t::nobody") == []
    assert await store.inbox("t::nobody", "all") == []
    with pytest.raises(ValueError, match="unknown message status 'bogus'"):
        await store.inbox("t::a", "bogus")


async def test_claim_next_is_fifo_and_marks_processing(store):
    ids = [(await store.send("t::lead", "t::w", f"job{i}")).id for i in range(3)]
    await store.send("t::lead", "t::other", "not mine")
    first = await store.claim_next("t::w")
    assert first is not None and first.id == ids[0]
    assert first.status == MessageStatus.PROCESSING and first.attempts == 1
    assert first.claim_token and first.claimed_by is None and first.lease_until is None
    second = await store.claim_next("t::w", worker_id="worker-7")
    assert second.id == ids[1] and second.claimed_by == "worker-7"
    assert second.claim_token != first.claim_token
    # get/inbox never hand out the token
    stored = await store.get(first.id)
    assert stored.status == MessageStatus.PROCESSING and stored.claim_token is None
    assert [m.id for m in await store.inbox("t::w", "processing")] == ids[:2]
    assert all(m.claim_token is None for m in await store.inbox("t::w", "all"))
    third = await store.claim_next("t::w")
    assert third.id == ids[2]
    assert await store.claim_next("t::w") is None
    assert await store.claim_next("t::never-used") is None
    assert [m.content for m in await store.inbox("t::other")] == ["not mine"]


async def test_claim_with_a_lease_records_worker_deadline_and_attempts(store):
    await store.send("t::lead", "t::w", "job")
    before = now_ms()
    claimed = await store.claim_next("t::w", lease_s=30, worker_id="w1")
    after = now_ms()
    assert claimed.claimed_by == "w1" and claimed.attempts == 1
    # lease_until is milliseconds: now + 30 000 (Redis uses its server clock, same host)
    assert before + 30_000 - 1_000 <= claimed.lease_until <= after + 30_000 + 1_000
    stored = await store.get(claimed.id)
    assert (stored.claimed_by, stored.lease_until, stored.attempts) == ("w1", claimed.lease_until, 1)


async def test_worker_ids_and_contents_round_trip_verbatim(store):
    worker = 'wörker "7" {a}/b\\c 日本'
    content = 'line 1\nline 2 "quoted" \\ {braces} / ü \u2028 \t end'
    m = await store.send(
        "t::lead", "t::w", content, metadata={"q": 'a"b', "nested": {"k": [None, True, 1.5]}}
    )
    c = await store.claim_next("t::w", lease_s=30, worker_id=worker)
    assert (c.id, c.claimed_by, c.content) == (m.id, worker, content)
    stored = await store.get(m.id)
    assert (stored.claimed_by, stored.content, stored.metadata) == (worker, content, m.metadata)
    assert [x.claimed_by for x in await store.inbox("t::w", "processing")] == [worker]


async def test_concurrent_claims_in_one_event_loop_never_share_a_message(store):
    ids = {(await store.send("t::lead", "t::w", f"m{i}")).id for i in range(30)}

    async def claimer() -> list[str]:
        got = []
        while (m := await store.claim_next("t::w", lease_s=60)) is not None:
            got.append(m.id)
        return got

    results = await asyncio.gather(*(claimer() for _ in range(8)))
    claimed = [i for r in results for i in r]
    assert len(claimed) == len(set(claimed)) == 30
    assert set(claimed) == ids


# --------------------------------------------------------------------------- state machine


async def _message_in(store: Any, box: str, status: str) -> str:
    m = await store.send("t::lead", box, f"in {status}")
    if status == "processing":
        assert (await store.claim_next(box)).id == m.id
    elif status != "pending":
        assert await store.update_status(m.id, status)
    return m.id


async def test_update_status_follows_the_transition_table(store):
    n = 0
    for current in ALL:
        for target in ALL:
            n += 1
            box = f"sm::{n}"
            mid = await _message_in(store, box, current)
            if target == current:
                assert await store.update_status(mid, target) is True  # no-op
                assert (await store.get(mid)).status == current
            elif target in ALLOWED[current]:
                assert await store.update_status(mid, target) is True, (current, target)
                assert (await store.get(mid)).status == target
                assert [m.id for m in await store.inbox(box, target)] == [mid]
                assert await store.inbox(box, current) == []
            else:
                with pytest.raises(InvalidTransitionError, match=f"from '{current}' to '{target}'"):
                    await store.update_status(mid, target)
                assert (await store.get(mid)).status == current, (current, target)
                assert [m.id for m in await store.inbox(box, current)] == [mid]


async def test_only_from_moves_only_from_the_statuses_asked(store):
    # a compare-and-set: a caller that read "parked" moves it to "pending" only
    # while it is still parked -- never releasing a claim taken meanwhile
    parked = await _message_in(store, "cas::a", "parked")
    assert await store.update_status(parked, "pending", only_from="parked") is True
    assert (await store.get(parked)).status == MessageStatus.PENDING
    # moved back and claimed meanwhile: the same move is refused, the claim holds
    claimed = await store.claim_next("cas::a", lease_s=30, worker_id="w1")
    assert claimed.id == parked
    with pytest.raises(InvalidTransitionError, match="from 'processing' to 'pending'.*only from 'parked'"):
        await store.update_status(parked, "pending", only_from=MessageStatus.PARKED)
    held = await store.get(parked)
    assert (held.status, held.claimed_by) == (MessageStatus.PROCESSING, "w1")
    assert [m.id for m in await store.inbox("cas::a", "processing")] == [parked]
    await store.extend_lease(parked, claimed.claim_token, 30)  # the claim's token still works
    # several statuses; the no-op rule holds; the table still decides
    assert await store.update_status(parked, "done", only_from=["processing", "parked"]) is True
    assert await store.update_status(parked, "done", only_from="parked") is True  # already done: a no-op
    read = await _message_in(store, "cas::b", "read")
    with pytest.raises(InvalidTransitionError, match="allowed targets"):
        await store.update_status(read, "pending", only_from="read")
    assert (await store.get(read)).status == MessageStatus.READ
    for bad in ("nope", []):
        with pytest.raises(ValueError):
            await store.update_status(read, "done", only_from=bad)
    assert (await store.get(read)).status == MessageStatus.READ
    assert await store.update_status(new_message_id("cas::b"), "done", only_from="read") is False


async def test_terminal_states_never_go_back(store):
    for terminal in ("done", "failed", "cancelled"):
        mid = await _message_in(store, f"term::{terminal}", terminal)
        for back in ("pending", "processing", "read", "parked"):
            with pytest.raises(InvalidTransitionError, match="terminal"):
                await store.update_status(mid, back)
        assert (await store.get(mid)).status == terminal
        assert await store.claim_next(f"term::{terminal}") is None


async def test_leaving_processing_clears_the_claim_and_release_keeps_fifo_place(store):
    first = await store.send("t::lead", "t::w", "first")
    await store.send("t::lead", "t::w", "second")
    claimed = await store.claim_next("t::w", lease_s=30, worker_id="w1")
    assert claimed.id == first.id
    assert await store.update_status(first.id, "pending")  # release
    released = await store.get(first.id)
    assert (released.status, released.claimed_by, released.lease_until, released.attempts) == (
        MessageStatus.PENDING,
        None,
        None,
        1,
    )
    again = await store.claim_next("t::w", lease_s=30, worker_id="w2")
    assert again.id == first.id and again.attempts == 2 and again.claimed_by == "w2"
    assert await store.update_status(first.id, "read")
    read = await store.get(first.id)
    assert (read.status, read.claimed_by, read.lease_until) == (MessageStatus.READ, None, None)
    # an unfenced change makes the old token useless
    with pytest.raises(ClaimMissingError):
        await store.complete(first.id, again.claim_token, "read")


async def test_update_status_refusals_change_nothing(store):
    m = await store.send("t::lead", "t::w", "x")
    assert await store.update_status("0123456789abcdef-" + "f" * 32, "done") is False
    assert await store.update_status("no-such-message", "done") is False
    with pytest.raises(ValueError, match="unknown message status 'finished'"):
        await store.update_status(m.id, "finished")
    with pytest.raises(ValueError):
        await store.update_status("no-such-message", "finished")  # status checked first
    with pytest.raises(InvalidTransitionError, match="only claim_next"):
        await store.update_status(m.id, "processing")
    assert await statuses(store, "t::w") == [("x", "pending")]
    assert (await store.counts("t::w"))["pending"] == 1


# --------------------------------------------------------------------------- leases and fencing


async def test_extend_lease_and_complete_with_the_token(store):
    await store.send("t::lead", "t::w", "job")
    c = await store.claim_next("t::w", lease_s=1, worker_id="w1")
    new_until = await store.extend_lease(c.id, c.claim_token, 60)
    assert isinstance(new_until, int) and new_until >= c.lease_until + 50_000
    assert (await store.get(c.id)).lease_until == new_until
    with pytest.raises(ValueError, match="unknown message status"):
        await store.complete(c.id, c.claim_token, "nope")
    with pytest.raises(InvalidTransitionError):
        await store.complete(c.id, c.claim_token, "processing")
    assert (await store.get(c.id)).status == MessageStatus.PROCESSING
    done = await store.complete(c.id, c.claim_token, "done")
    assert (done.id, done.status, done.claimed_by, done.lease_until, done.attempts) == (
        c.id,
        MessageStatus.DONE,
        None,
        None,
        1,
    )
    assert done.claim_token is None
    # the holder repeating its own successful call (e.g. after a lost reply) gets the same answer
    assert await store.complete(c.id, c.claim_token, "done") == done
    with pytest.raises(ClaimMissingError):
        await store.complete(c.id, c.claim_token, "failed")
    with pytest.raises(ClaimMissingError):
        await store.extend_lease(c.id, c.claim_token, 10)
    assert (await store.get(c.id)).status == MessageStatus.DONE


async def test_claim_without_lease_still_gets_a_token_that_fences(store):
    await store.send("t::lead", "t::w", "job")
    c = await store.claim_next("t::w")
    with pytest.raises(ClaimTakenError):
        await store.complete(c.id, "0" * 32, "done")
    assert (await store.get(c.id)).status == MessageStatus.PROCESSING
    # a claim without a lease never expires
    assert await store.requeue_expired(now_ms=now_ms() + 10**9) == []
    assert (await store.complete(c.id, c.claim_token, "failed")).status == MessageStatus.FAILED


async def test_fencing_distinguishes_taken_from_missing(store):
    await store.send("t::lead", "t::w", "job")
    old = await store.claim_next("t::w", lease_s=30, worker_id="slow")
    moved = await store.requeue_expired(now_ms=old.lease_until)  # expired exactly at lease_until
    assert [(m.id, m.status, m.claimed_by, m.lease_until, m.attempts) for m in moved] == [
        (old.id, MessageStatus.PENDING, None, None, 1)
    ]
    # requeued, not re-claimed: the claim is missing
    with pytest.raises(ClaimMissingError) as missing:
        await store.complete(old.id, old.claim_token, "done")
    assert missing.value.reason == "missing"
    with pytest.raises(ClaimMissingError):
        await store.extend_lease(old.id, old.claim_token, 30)
    new = await store.claim_next("t::w", lease_s=30, worker_id="fast")
    assert new.id == old.id and new.attempts == 2
    # re-claimed by someone else: the claim is taken
    with pytest.raises(ClaimTakenError) as taken:
        await store.complete(old.id, old.claim_token, "done")
    assert taken.value.reason == "taken"
    with pytest.raises(ClaimTakenError):
        await store.extend_lease(old.id, old.claim_token, 30)
    assert (await store.get(old.id)).claimed_by == "fast"
    finished = await store.complete(new.id, new.claim_token, "done")
    assert finished.status == MessageStatus.DONE
    # the successor finished it: the stale claim is missing and changes nothing
    with pytest.raises(ClaimMissingError):
        await store.complete(old.id, old.claim_token, "failed")
    assert (await store.get(old.id)).status == MessageStatus.DONE
    with pytest.raises(ClaimMissingError):
        await store.complete("0123456789abcdef-" + "1" * 32, old.claim_token, "done")
    with pytest.raises(ClaimMissingError):
        await store.complete("garbage", old.claim_token, "done")


async def test_requeue_expired_moves_only_expired_claims_and_fails_past_max_attempts(store):
    a = await store.send("t::lead", "t::w", "a")
    b = await store.send("t::lead", "t::w", "b")
    c = await store.send("t::lead", "t::w", "c")
    later = await store.send("t::lead", "t::w", "later")
    x = await store.send("t::lead", "t::x", "x")
    ca = await store.claim_next("t::w", lease_s=10)
    cb = await store.claim_next("t::w", lease_s=100)
    cc = await store.claim_next("t::w")  # no lease
    cx = await store.claim_next("t::x", lease_s=10)
    assert [ca.id, cb.id, cc.id, cx.id] == [a.id, b.id, c.id, x.id]
    cutoff = max(ca.lease_until, cx.lease_until)
    assert cutoff < cb.lease_until
    assert await store.requeue_expired(now_ms=ca.lease_until - 1 - 10**6) == []
    moved = await store.requeue_expired(now_ms=cutoff)
    assert sorted((m.id, m.status.value) for m in moved) == sorted([(a.id, "pending"), (x.id, "pending")])
    assert await store.requeue_expired(now_ms=cutoff) == []  # nothing left to move
    # the requeued message is first in line again (it keeps its send order)
    again = await store.claim_next("t::w", lease_s=10)
    assert again.id == a.id and again.attempts == 2
    assert (await store.claim_next("t::w", lease_s=10)).id == later.id
    moved = await store.requeue_expired(max_attempts=2, now_ms=cb.lease_until)
    by_id = {m.id: m for m in moved}
    assert by_id[a.id].status == MessageStatus.FAILED and by_id[a.id].attempts == 2  # expired twice
    assert by_id[b.id].status == MessageStatus.PENDING and by_id[b.id].attempts == 1
    assert by_id[later.id].status == MessageStatus.PENDING
    assert cc.id not in by_id
    assert (await store.get(a.id)).status == MessageStatus.FAILED
    assert await statuses(store, "t::w") == [
        ("a", "failed"),
        ("b", "pending"),
        ("c", "processing"),
        ("later", "pending"),
    ]


async def test_only_expired_claims_count_toward_max_attempts(store):
    """A claim handed back on purpose (parked then resolved, or released by its
    holder to wait) adds to ``attempts`` but not to the expired claims that
    ``max_attempts`` bounds."""
    m = await store.send("t::lead", "t::w", "job")
    for _ in range(3):
        claimed = await store.claim_next("t::w", lease_s=30)
        await store.complete(m.id, claimed.claim_token, "parked")
        assert await store.update_status(m.id, "pending")  # a person resolved it
    claimed = await store.claim_next("t::w", lease_s=30)
    await store.complete(m.id, claimed.claim_token, "pending")  # its holder gave it back to wait
    claimed = await store.claim_next("t::w", lease_s=10)
    assert claimed.attempts == 5
    [moved] = await store.requeue_expired(max_attempts=2, now_ms=claimed.lease_until)
    assert (moved.id, moved.status) == (m.id, MessageStatus.PENDING)  # its first expired claim
    claimed = await store.claim_next("t::w", lease_s=10)
    [moved] = await store.requeue_expired(max_attempts=2, now_ms=claimed.lease_until)
    assert moved.status == MessageStatus.FAILED and moved.attempts == 6  # the second one
    assert (await store.get(m.id)).status == MessageStatus.FAILED


async def test_short_real_lease_expires_without_now_override(store):
    await store.send("t::lead", "t::w", "job")
    c = await store.claim_next("t::w", lease_s=0.05)
    await asyncio.sleep(max(0.0, (c.lease_until + 20 - now_ms()) / 1000))  # past the lease
    moved = await store.requeue_expired()
    assert [m.id for m in moved] == [c.id]
    assert (await store.get(c.id)).status == MessageStatus.PENDING


async def test_claim_next_of_one_message_claims_it_only_while_it_is_pending_there(store):
    ids = [(await store.send("t::lead", "t::w", f"job{i}")).id for i in range(3)]
    other = await store.send("t::lead", "t::other", "not this mailbox's")
    second = await store.claim_next("t::w", message_id=ids[1], worker_id="w-1", lease_s=30)
    assert (second.id, second.status, second.attempts, second.claimed_by) == (
        ids[1],
        MessageStatus.PROCESSING,
        1,
        "w-1",
    )
    assert second.claim_token and second.lease_until
    assert await store.claim_next("t::w", message_id=ids[1]) is None  # no longer pending
    assert await store.claim_next("t::w", message_id=other.id) is None  # addressed elsewhere
    assert await store.claim_next("t::w", message_id=new_message_id("t::w")) is None  # unknown
    assert await store.claim_next("t::w", message_id="not-an-id") is None
    with pytest.raises(TypeError):
        await store.claim_next("t::w", message_id=7)
    # the others keep their FIFO order, the skipped one comes back in its place
    assert (await store.claim_next("t::w")).id == ids[0]
    moved = await store.requeue_expired(now_ms=2**50)
    assert [m.id for m in moved] == [ids[1]]
    assert [(await store.claim_next("t::w")).id for _ in range(2)] == [ids[1], ids[2]]
    assert await store.claim_next("t::w") is None
    # a serial mailbox's bound holds for it too
    serial = await store.send("t::lead", "t::serial", "s0")
    later = await store.send("t::lead", "t::serial", "s1")
    assert (await store.claim_next("t::serial", message_id=later.id, max_in_flight=1)).id == later.id
    assert await store.claim_next("t::serial", message_id=serial.id, max_in_flight=1) is None
    assert [m.id for m in await store.inbox("t::serial")] == [serial.id]


async def test_max_in_flight_limits_processing_per_mailbox(store):
    for i in range(4):
        await store.send("t::lead", "t::serial", f"s{i}")
    await store.send("t::lead", "t::other", "o")
    one = await store.claim_next("t::serial", max_in_flight=1, lease_s=30)
    assert one.content == "s0"
    assert await store.claim_next("t::serial", max_in_flight=1) is None
    assert (await store.claim_next("t::other", max_in_flight=1)).content == "o"  # per mailbox
    assert (await store.claim_next("t::serial", max_in_flight=2)).content == "s1"
    assert await store.claim_next("t::serial", max_in_flight=2) is None
    await store.complete(one.id, one.claim_token, "done")
    assert (await store.claim_next("t::serial", max_in_flight=2)).content == "s2"
    assert await store.claim_next("t::nobody", max_in_flight=1) is None


# --------------------------------------------------------------------------- extras


async def test_counts_and_mailbox_ids(store):
    assert await store.counts("team::a") == {s: 0 for s in ALL}
    assert await store.mailbox_ids() == []
    for i in range(3):
        await store.send("team::lead", "team::a", f"m{i}")
    await store.send("team::a", "team::lead", "r")
    await store.send("x", "team_%::b", "odd")
    await store.send("x", "other::lead", "o")
    c = await store.claim_next("team::a")
    await store.complete(c.id, c.claim_token, "done")
    await store.claim_next("team::a")
    assert await store.counts("team::a") == {**{s: 0 for s in ALL}, "pending": 1, "processing": 1, "done": 1}
    assert await store.mailbox_ids() == sorted(["team::a", "team::lead", "team_%::b", "other::lead"])
    assert await store.mailbox_ids("team::") == ["team::a", "team::lead"]
    assert await store.mailbox_ids("team_%") == ["team_%::b"]  # no LIKE wildcards
    assert await store.mailbox_ids("zzz") == []


async def test_mailbox_from_url_builds_each_store(kind, tmp_path, request):
    url = {
        "memory": "memory://",
        "redis": REDIS_URL,
        "cluster": "redis+cluster://127.0.0.1:7000,127.0.0.1:7001",  # not connected to
        "sqlite": f"sqlite:///{tmp_path}/u.db",
        "postgres": PG_URL,
    }[kind]
    expected = {"sqlite": SQLMailbox, "postgres": SQLMailbox, "memory": MemoryMailbox}.get(kind, RedisMailbox)
    kwargs = {"redis": {"prefix": "test-url"}, "postgres": {"table_prefix": "t_url_"}}.get(kind, {})
    mb = mailbox_from_url(url, **kwargs)
    assert type(mb) is expected
    if kind == "postgres":
        assert mb.url.startswith("postgresql+psycopg://")
    await mb.aclose()


def test_mailbox_from_url_refuses_unknown_schemes():
    for bad in ("http://x", "mysql://db", "memory", "", "redis:/x"):
        with pytest.raises(ValueError, match=r"accepted schemes: memory://, redis://"):
            mailbox_from_url(bad)
    assert type(mailbox_from_url("postgresql+psycopg://postgres@127.0.0.1/test")) is SQLMailbox
    assert type(mailbox_from_url("rediss://127.0.0.1:6380/0")) is RedisMailbox


# --------------------------------------------------------------------------- bad input


async def test_bad_mailbox_ids_are_refused_and_nothing_is_written(store):
    for bad, pattern in [
        ("", "must not be empty"),
        ("x" * 513, "513 characters long; the limit is 512"),
        ("team::a\nb", "control or separator"),
        ("team::a\x00", "control or separator"),
        ("team::\u2028", "control or separator"),
        ("\ud800", "control or separator"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            await store.send("t::lead", bad, "x")
        with pytest.raises(ValueError, match=pattern):
            await store.send(bad, "t::ok", "x")
        for call in (store.inbox(bad), store.claim_next(bad), store.counts(bad)):
            with pytest.raises(ValueError, match=pattern):
                await call
    with pytest.raises(TypeError, match="mailbox id"):
        await store.send("t::lead", None, "x")
    with pytest.raises(TypeError, match="content must be a str"):
        await store.send("t::lead", "t::ok", 42)
    with pytest.raises(TypeError, match="metadata must be a dict"):
        await store.send("t::lead", "t::ok", "x", metadata=["a"])
    with pytest.raises(ValueError, match="cannot be stored"):
        await store.send("t::lead", "t::ok", "x", metadata={"f": object()})
    with pytest.raises(ValueError, match="cannot be stored"):
        await store.send("t::lead", "t::ok", "x", metadata={"nan": float("nan")})
    with pytest.raises(ValueError, match="cannot be stored"):
        await store.send("t::lead", "t::ok", "bad \ud800 surrogate")
    with pytest.raises(ValueError, match="NUL"):
        await store.send("t::lead", "t::ok", "nul \x00 inside")
    assert await store.mailbox_ids() == []
    assert await store.inbox("t::ok", "all") == []
    ok = await store.send("t::lead", "x" * 512, "longest allowed id")
    assert (await store.get(ok.id)).to == "x" * 512


async def test_near_identical_ids_never_collide(store):
    ids = [
        "team::a",
        "team::a ",
        " team::a",
        "team:::a",
        "team::{a}",
        "team::}a{",
        "{team}::a",
        "team::\u00e9",  # é precomposed
        "team::e\u0301",  # e + combining accent
        "team::日本",
        "team::a:b",
        "team::a_b",
        "team::a%b",
    ]
    sent = {box: await store.send("t::lead", box, f"to {box!r}") for box in ids}
    assert await store.mailbox_ids() == sorted(ids)
    for box in ids:
        assert [m.content for m in await store.inbox(box)] == [f"to {box!r}"]
        assert (await store.counts(box))["pending"] == 1
    claimed = await store.claim_next("team::{a}")
    assert claimed.id == sent["team::{a}"].id and claimed.to == "team::{a}"
    assert await store.claim_next("team::{a}") is None
    for box in ids:
        expected = "processing" if box == "team::{a}" else "pending"
        assert [m.status.value for m in await store.inbox(box, "all")] == [expected]


async def test_message_over_the_size_bound_is_refused_and_nothing_is_written(kind, make_store):
    store = make_store(kind, max_message_bytes=1000)
    with pytest.raises(MessageTooLargeError, match="is 1001 bytes .* the bound is 1000 bytes") as err:
        await store.send("t::lead", "t::big", "x" * 999)  # + len("{}") for the empty metadata
    assert isinstance(err.value, ValueError)
    # metadata counts too, and content is measured in UTF-8 bytes
    with pytest.raises(MessageTooLargeError):
        await store.send("t::lead", "t::big", "x" * 900, metadata={"pad": "y" * 100})
    with pytest.raises(MessageTooLargeError, match="is 1002 bytes"):
        await store.send("t::lead", "t::big", "é" * 500)
    assert await store.inbox("t::big", "all") == []
    assert await store.mailbox_ids() == []
    fits = await store.send("t::lead", "t::big", "x" * 998, metadata={})  # 998 + len("{}") == 1000
    assert (await store.get(fits.id)).content == "x" * 998


async def test_default_bound_is_one_mebibyte(store):
    with pytest.raises(MessageTooLargeError, match="the bound is 1048576 bytes"):
        await store.send("t::lead", "t::big", "x" * (1024 * 1024 - 1))  # + "{}" = 1 MiB + 1
    assert await store.inbox("t::big", "all") == []


async def test_bad_claim_and_lease_arguments_are_refused_and_change_nothing(store):
    m = await store.send("t::lead", "t::w", "job")
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lease_s"):
            await store.claim_next("t::w", lease_s=bad)
    for bad in ("5", True):
        with pytest.raises(TypeError, match="lease_s"):
            await store.claim_next("t::w", lease_s=bad)
    with pytest.raises(ValueError, match="max_in_flight must be >= 1"):
        await store.claim_next("t::w", max_in_flight=0)
    with pytest.raises(ValueError, match="worker_id"):
        await store.claim_next("t::w", worker_id="")
    with pytest.raises(ValueError, match="limit must be >= 1"):
        await store.inbox("t::w", limit=0)
    assert await statuses(store, "t::w") == [("job", "pending")]
    c = await store.claim_next("t::w", lease_s=30)
    with pytest.raises(ValueError, match="lease_s"):
        await store.extend_lease(c.id, c.claim_token, 0)
    with pytest.raises(TypeError, match="claim token"):
        await store.complete(c.id, None, "done")
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        await store.requeue_expired(max_attempts=0)
    with pytest.raises(TypeError, match="now_ms"):
        await store.requeue_expired(now_ms=1.5)
    stored = await store.get(m.id)
    assert (stored.status, stored.lease_until) == (MessageStatus.PROCESSING, c.lease_until)


# --------------------------------------------------------------------------- parked (crash-safe tool calls)


async def test_the_claim_holder_parks_a_message_and_nobody_claims_or_requeues_it(store):
    first = await store.send("t::lead", "t::w", "first")
    second = await store.send("t::lead", "t::w", "second")
    claimed = await store.claim_next("t::w", lease_s=1, worker_id="w1")
    assert claimed.id == first.id
    with pytest.raises(ClaimTakenError):
        await store.complete(first.id, "0" * 32, "parked")  # only the holder parks it
    parked = await store.complete(first.id, claimed.claim_token, "parked")
    assert (parked.status, parked.claimed_by, parked.lease_until, parked.attempts) == (
        MessageStatus.PARKED,
        None,
        None,
        1,
    )
    assert await store.complete(first.id, claimed.claim_token, "parked") == parked  # replay
    with pytest.raises(ClaimMissingError):
        await store.extend_lease(first.id, claimed.claim_token, 30)
    # never requeued by the reaper, never claimed
    assert await store.requeue_expired(now_ms=now_ms() + 10**9, max_attempts=1) == []
    assert (await store.claim_next("t::w")).id == second.id
    assert await store.claim_next("t::w") is None
    assert [m.id for m in await store.inbox("t::w", "parked")] == [first.id]
    assert [m.id for m in await store.inbox("t::w", MessageStatus.PARKED)] == [first.id]
    assert (await store.counts("t::w"))["parked"] == 1
    assert (await store.get(first.id)).status == MessageStatus.PARKED


async def test_a_parked_message_goes_back_to_pending_in_its_fifo_place_or_ends(store):
    first = await store.send("t::lead", "t::w", "first")
    claimed = await store.claim_next("t::w", lease_s=30)
    await store.complete(first.id, claimed.claim_token, "parked")
    later = await store.send("t::lead", "t::w", "later")
    for refused in ("read", "processing"):
        with pytest.raises(InvalidTransitionError):
            await store.update_status(first.id, refused)
    assert (await store.get(first.id)).status == MessageStatus.PARKED
    with pytest.raises(ClaimMissingError):
        await store.complete(first.id, claimed.claim_token, "done")  # a parked message has no claim
    assert await store.update_status(first.id, "pending")  # retry
    again = await store.claim_next("t::w", lease_s=30)
    assert again.id == first.id and again.attempts == 2  # ahead of the later message
    await store.complete(first.id, again.claim_token, "parked")
    assert await store.update_status(first.id, "done")
    assert (await store.get(first.id)).status == MessageStatus.DONE
    assert (await store.claim_next("t::w")).id == later.id
    for end in ("failed", "cancelled"):
        m = await store.send("t::lead", f"t::{end}", end)
        c = await store.claim_next(f"t::{end}")
        await store.complete(m.id, c.claim_token, "parked")
        assert await store.update_status(m.id, end)
        assert (await store.get(m.id)).status == end


async def test_a_parked_message_keeps_its_place_in_a_serial_mailbox(store):
    first = await store.send("t::lead", "t::serial", "first")
    await store.send("t::lead", "t::serial", "second")
    claimed = await store.claim_next("t::serial", max_in_flight=1, lease_s=30)
    await store.complete(first.id, claimed.claim_token, "parked")
    assert await store.claim_next("t::serial", max_in_flight=1) is None  # parked counts as in flight
    assert (await store.claim_next("t::serial", max_in_flight=2)).content == "second"
    assert await store.update_status(first.id, "cancelled")
    assert await store.claim_next("t::serial", max_in_flight=2) is None  # nothing pending


@pytest.mark.parametrize("sql_kind", ["sqlite", "postgres"])
async def test_a_table_from_before_the_expired_column_gets_it_and_keeps_its_messages(sql_kind, make_store):
    from sqlalchemy import text

    old = make_store(sql_kind)
    kept = await old.send("t::lead", "t::w", "sent by an earlier release")
    url = old.engine.url.render_as_string(hide_password=False)

    def drop_column() -> None:
        with old.engine.begin() as conn:
            conn.execute(text(f'ALTER TABLE "{old.table_prefix}messages" DROP COLUMN expired'))

    await asyncio.to_thread(drop_column)
    new = SQLMailbox(url, table_prefix=old.table_prefix)
    try:
        claimed = await new.claim_next("t::w", lease_s=10)
        assert claimed.id == kept.id and claimed.content == "sent by an earlier release"
        [moved] = await new.requeue_expired(max_attempts=1, now_ms=claimed.lease_until)
        assert moved.status == MessageStatus.FAILED  # its one expired claim, counted in the new column
    finally:
        await new.aclose()
