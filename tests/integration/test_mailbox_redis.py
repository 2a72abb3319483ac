"""Redis-specific behaviour of ``RedisMailbox``: key layout and hash tags, Lua
script headers and EVALSHA reloading, one client per event loop, the tag
collision guard, and Redis going away mid-call (docs/architecture.md).

Real Redis on 127.0.0.1:6379; every test uses its own key prefix and deletes
its keys. The connection cuts go through a tiny asyncio TCP proxy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import threading
import uuid
from collections.abc import AsyncIterator
from importlib import resources

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from lattice_mailbox import MailboxError, MessageStatus, redis_layout
from lattice_mailbox import redis as redis_store
from lattice_mailbox.base import ClaimMissingError, ClaimTakenError
from lattice_mailbox.redis import RedisMailbox
from lattice_mailbox.validation import mailbox_tag
from tests.support.services import REDIS_DB, REDIS_HOST, REDIS_PORT, REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


@pytest.fixture
async def prefix() -> AsyncIterator[str]:
    value = f"test-{uuid.uuid4().hex}"
    yield value
    client = aioredis.Redis.from_url(REDIS_URL)
    keys = [k async for k in client.scan_iter(match=f"{value}:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


@pytest.fixture
async def raw() -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(REDIS_URL, decode_responses=True)
    yield client
    await client.aclose()


async def test_every_key_of_a_mailbox_shares_its_hash_tag(prefix, raw):
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    box = "team::{odd} id: ü"
    m = await mb.send("team::lead", box, "hi")
    c = await mb.claim_next(box, lease_s=30)
    await mb.complete(c.id, c.claim_token, "done")
    await mb.send("team::lead", box, "again")
    tag = mailbox_tag(box)
    assert m.id.startswith(f"{tag}-")
    keys = sorted([k async for k in raw.scan_iter(match=f"{prefix}:*")])
    assert f"{prefix}:mailboxes" in keys
    tagged = [k for k in keys if k != f"{prefix}:mailboxes"]
    assert tagged and all(k.startswith(f"{prefix}:{{{tag}}}:") for k in tagged)
    # the first {...} of every key is the tag: one cluster slot per mailbox
    assert {re.search(r"\{([^}]*)\}", k).group(1) for k in tagged} == {tag}
    assert await raw.get(f"{prefix}:{{{tag}}}:name") == box
    # per-status indexes: inbox(status) reads one sorted set
    assert await raw.zrange(f"{prefix}:{{{tag}}}:q:done", 0, -1) == [m.id]
    assert await raw.zcard(f"{prefix}:{{{tag}}}:q:pending") == 1
    assert await raw.smembers(f"{prefix}:mailboxes") == {box}
    await mb.aclose()


def test_lua_scripts_have_headers_and_never_build_keys():
    folder = resources.files("lattice_mailbox") / "lua"
    names = sorted(p.name for p in folder.iterdir() if p.name.endswith(".lua"))
    assert names == [
        "claim_next.lua",
        "complete.lua",
        "extend_lease.lua",
        "find_claim.lua",
        "inbox.lua",
        "requeue_expired.lua",
        "send.lua",
        "update_status.lua",
    ]
    for name in names:
        source = (folder / name).read_text()
        header = [line for line in source.splitlines() if line.startswith("--")]
        text = "\n".join(header)
        for section in ("KEYS[1]", "ARGV[1]", "Returns"):
            assert section in text, (name, section)
        code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith("--"))
        assert ".." not in code, f"{name} concatenates strings (keys must come from KEYS[])"
        assert "KEYS[" in code


async def test_scripts_run_by_sha_and_reload_after_noscript(prefix, raw, monkeypatch):
    # A variant of the claim script that this Redis has never seen: the first
    # EVALSHA gets NOSCRIPT, the store loads it and retries transparently.
    original = redis_store._SCRIPTS["claim_next"]
    variant_source = original.source + f"\n-- variant {uuid.uuid4().hex}\n"
    sha = hashlib.sha1(variant_source.encode()).hexdigest()
    monkeypatch.setitem(
        redis_store._SCRIPTS, "claim_next", redis_layout.Script("claim_next", variant_source, sha)
    )
    assert await raw.script_exists(sha) == [False]
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    await mb.send("t::lead", "t::w", "job")
    claimed = await mb.claim_next("t::w")
    assert claimed is not None and claimed.content == "job"
    assert await raw.script_exists(sha) == [True]
    await mb.send("t::lead", "t::w", "job2")
    assert (await mb.claim_next("t::w")).content == "job2"
    await mb.aclose()


async def test_one_client_per_event_loop(prefix):
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    m = await mb.send("t::lead", "t::w", "from the test loop")
    here = mb.client()

    def other_loop() -> tuple[str, int]:
        async def work() -> tuple[str, int]:
            client = mb.client()
            claimed = await mb.claim_next("t::w")
            result = (claimed.id, id(client))
            await mb.aclose()
            return result

        return asyncio.run(work())

    claimed_id, other_client = await asyncio.to_thread(other_loop)
    assert claimed_id == m.id
    assert other_client != id(here)
    assert (await mb.get(m.id)).status == MessageStatus.PROCESSING
    await mb.aclose()


async def test_a_given_client_is_used_and_left_open(prefix):
    client = aioredis.Redis.from_url(REDIS_URL)
    mb = RedisMailbox(client, prefix=prefix)
    assert mb.client() is client
    await mb.send("t::lead", "t::w", "x")
    await mb.aclose()
    assert await client.ping() is True
    await client.aclose()
    with pytest.raises(TypeError, match="Redis URL"):
        RedisMailbox(42)
    for bad in ("", "a{b", "a b"):
        with pytest.raises(ValueError, match="key prefix"):
            RedisMailbox(REDIS_URL, prefix=bad)


async def test_a_hash_tag_owned_by_another_mailbox_id_is_never_shared(prefix, raw):
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    await mb.send("t::lead", "t::owner", "mine")
    # Pretend "t::intruder" hashes to the owner's tag (a 64-bit collision) by
    # pointing its tag's owner record at somebody else.
    tag = mailbox_tag("t::intruder")
    await raw.set(f"{prefix}:{{{tag}}}:name", "t::somebody-else")
    with pytest.raises(MailboxError, match="shares its hash tag"):
        await mb.send("t::lead", "t::intruder", "x")
    assert await raw.hlen(f"{prefix}:{{{tag}}}:state") == 0
    assert await mb.inbox("t::intruder", "all") == []
    assert await mb.claim_next("t::intruder") is None
    assert await mb.counts("t::intruder") == {s.value: 0 for s in MessageStatus}
    await mb.aclose()


# --------------------------------------------------------------------------- Redis going away


class CuttingProxy:
    """A TCP proxy to Redis that can cut the connection around the next EVALSHA.

    ``mode``: ``"pass"`` forwards everything; ``"drop_request"`` closes the
    client connection instead of forwarding the next EVALSHA; ``"drop_response"``
    forwards it to Redis, then closes the client connection instead of relaying
    the answer; ``"stall"`` swallows the next EVALSHA and keeps the connection
    open (Redis never sees it, the caller never gets an answer). Each cut happens
    once, then the proxy passes traffic again.
    """

    def __init__(self) -> None:
        self.mode = "pass"
        self.cuts = 0
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection(REDIS_HOST, REDIS_PORT)
        swallow = asyncio.Event()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.mode != "pass" and b"EVALSHA" in data.upper():
                    mode, self.mode = self.mode, "pass"
                    self.cuts += 1
                    if mode == "stall":
                        continue
                    if mode == "drop_request":
                        client_w.close()
                        redis_w.close()
                        return
                    swallow.set()
                redis_w.write(data)
                await redis_w.drain()
            redis_w.close()

        async def downstream() -> None:
            while data := await redis_r.read(65536):
                if swallow.is_set():
                    client_w.close()  # the answer never reaches the caller
                    redis_w.close()
                    return
                client_w.write(data)
                await client_w.drain()
            client_w.close()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for w in (client_w, redis_w):
                w.close()


@pytest.fixture
async def proxy() -> AsyncIterator[CuttingProxy]:
    p = CuttingProxy()
    await p.start()
    yield p
    await p.stop()


async def _consistent(raw: aioredis.Redis, prefix: str, box: str) -> dict[str, list[str]]:
    """Every message has body + state and sits in exactly the index of its status."""
    tag = mailbox_tag(box)
    base = f"{prefix}:{{{tag}}}"
    bodies = await raw.hgetall(f"{base}:body")
    states = {k: json.loads(v) for k, v in (await raw.hgetall(f"{base}:state")).items()}
    assert set(bodies) == set(states)
    indexes = {s.value: await raw.zrange(f"{base}:q:{s.value}", 0, -1) for s in MessageStatus}
    listed = [i for ids in indexes.values() for i in ids]
    assert sorted(listed) == sorted(states)  # each message in exactly one index
    for status, ids in indexes.items():
        assert all(states[i]["s"] == status for i in ids)
    return indexes


async def test_send_cut_before_redis_sees_it_is_sent_again_and_stored_once(prefix, raw, proxy):
    mb = RedisMailbox(f"redis://127.0.0.1:{proxy.port}/{REDIS_DB}", prefix=prefix)
    await mb.send("t::lead", "t::w", "warm-up")  # loads the script, opens the connection
    proxy.mode = "drop_request"  # the connection dies before Redis sees the send
    sent = await mb.send("t::lead", "t::w", "lost")
    assert proxy.cuts == 1
    indexes = await _consistent(raw, prefix, "t::w")
    # sent again on a new connection with the same message id: stored once
    assert [(m.id, m.content) for m in await mb.inbox("t::w", "all")][1] == (sent.id, "lost")
    assert [m.content for m in await mb.inbox("t::w", "all")] == ["warm-up", "lost"]
    assert len(indexes["pending"]) == 2
    await mb.aclose()


async def test_send_whose_reply_was_lost_is_stored_once_not_twice(prefix, raw, proxy):
    mb = RedisMailbox(f"redis://127.0.0.1:{proxy.port}/{REDIS_DB}", prefix=prefix)
    await mb.send("t::lead", "t::w", "warm-up")
    proxy.mode = "drop_response"  # Redis runs the send, its reply never arrives
    sent = await mb.send("t::lead", "t::w", "maybe")
    assert proxy.cuts == 1
    indexes = await _consistent(raw, prefix, "t::w")
    # sent again with the same id: send.lua answered DUPLICATE, one complete copy
    assert [(m.id, m.content) for m in await mb.inbox("t::w", "all")] == [
        (indexes["pending"][0], "warm-up"),
        (sent.id, "maybe"),
    ]
    assert len(indexes["pending"]) == 2
    await mb.aclose()


async def test_a_claim_whose_reply_was_lost_is_found_by_its_token_not_claimed_again(prefix, raw, proxy):
    mb = RedisMailbox(f"redis://127.0.0.1:{proxy.port}/{REDIS_DB}", prefix=prefix)
    direct = RedisMailbox(REDIS_URL, prefix=prefix)
    first = await mb.send("t::lead", "t::w", "first")
    await mb.send("t::lead", "t::w", "second")
    assert await mb.claim_next("t::empty") is None  # loads the claim script
    proxy.mode = "drop_response"  # Redis runs the claim, its reply never arrives
    claimed = await mb.claim_next("t::w", lease_s=30, worker_id="w1")
    assert proxy.cuts == 1
    # the claim token decided: the claim that happened is returned, no second claim was made
    assert (claimed.id, claimed.status, claimed.attempts, claimed.claimed_by) == (
        first.id, MessageStatus.PROCESSING, 1, "w1",
    )  # fmt: skip
    indexes = await _consistent(raw, prefix, "t::w")
    assert len(indexes["processing"]) == 1 and len(indexes["pending"]) == 1
    stored = await direct.get(first.id)
    assert (stored.status, stored.claimed_by, stored.lease_until) == (
        MessageStatus.PROCESSING,
        "w1",
        claimed.lease_until,
    )
    await mb.complete(claimed.id, claimed.claim_token, "done")
    proxy.mode = "drop_request"  # the claim never reaches Redis: nothing was claimed, it says so
    with pytest.raises(RedisConnectionError):
        await mb.claim_next("t::w", lease_s=30)
    indexes = await _consistent(raw, prefix, "t::w")
    assert len(indexes["pending"]) == 1 and not indexes["processing"]
    again = await mb.claim_next("t::w", lease_s=30)
    assert again.content == "second" and again.attempts == 1
    await mb.aclose()
    await direct.aclose()


async def test_a_call_that_gets_no_answer_times_out_and_the_store_recovers(prefix, raw, proxy):
    # the store's connections write without redis-py's per-command task: reads are still
    # bounded by socket_timeout, and the timed-out connection is replaced
    mb = RedisMailbox(f"redis://127.0.0.1:{proxy.port}/{REDIS_DB}", prefix=prefix, socket_timeout=0.5)
    await mb.send("t::lead", "t::w", "first")
    proxy.mode = "stall"
    with pytest.raises(RedisTimeoutError):
        await mb.send("t::lead", "t::w", "never stored")
    assert proxy.cuts == 1
    claimed = await mb.claim_next("t::w", lease_s=30)
    assert claimed is not None and claimed.content == "first"
    await mb.complete(claimed.id, claimed.claim_token, "done")
    assert [m.content for m in await mb.inbox("t::w", "all")] == ["first"]
    await _consistent(raw, prefix, "t::w")
    await mb.aclose()


async def test_every_store_object_registers_a_mailbox_on_its_first_send_to_it(prefix, raw):
    registry = f"{prefix}:mailboxes"
    first = RedisMailbox(REDIS_URL, prefix=prefix)
    await first.send("t::lead", "t::w", "one")
    await first.send("t::lead", "t::w", "two")
    assert await raw.smembers(registry) == {"t::w"}
    await raw.delete(registry)
    other = RedisMailbox(REDIS_URL, prefix=prefix)  # e.g. another worker process
    await other.send("t::lead", "t::w", "three")
    await first.send("t::lead", "t::x", "four")  # a mailbox id new to this object
    assert await raw.smembers(registry) == {"t::w", "t::x"}
    assert await other.mailbox_ids() == ["t::w", "t::x"]
    assert [m.content for m in await other.inbox("t::w")] == ["one", "two", "three"]
    await first.aclose()
    await other.aclose()


async def test_finish_claim_is_a_fenced_complete_without_the_message(prefix, raw):
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    sent = await mb.send("t::lead", "t::w", "task")
    claimed = await mb.claim_next("t::w", lease_s=30)
    with pytest.raises(ClaimTakenError):
        await mb.finish_claim(sent.id, "not-the-token", "done")
    assert (await mb.get(sent.id)).status == MessageStatus.PROCESSING
    assert await mb.finish_claim(sent.id, claimed.claim_token, "failed") is None
    assert (await mb.get(sent.id)).status == MessageStatus.FAILED
    indexes = await _consistent(raw, prefix, "t::w")
    assert indexes["failed"] == [sent.id] and indexes["processing"] == []
    assert await raw.zscore(f"{prefix}:{{{mailbox_tag('t::w')}}}:leases", sent.id) is None
    await mb.finish_claim(sent.id, claimed.claim_token, "failed")  # a replay is accepted
    with pytest.raises(ClaimMissingError):
        await mb.finish_claim(sent.id, claimed.claim_token, "done")
    await mb.aclose()


async def test_redis_down_raises_connection_error(prefix):
    # a port nobody listens on
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mb = RedisMailbox(f"redis://127.0.0.1:{port}/0", prefix=prefix)
    with pytest.raises(RedisConnectionError):
        await mb.send("t::lead", "t::w", "x")
    with pytest.raises(RedisConnectionError):
        await mb.claim_next("t::w")
    await mb.aclose()


def test_threads_with_their_own_loops_share_one_store(prefix):
    mb = RedisMailbox(REDIS_URL, prefix=prefix)
    asyncio.run(_send_many(mb, 40))
    claimed: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        async def run() -> None:
            while (m := await mb.claim_next("t::w")) is not None:
                with lock:
                    claimed.append(m.id)
            await mb.aclose()

        asyncio.run(run())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(claimed) == len(set(claimed)) == 40


async def _send_many(mb: RedisMailbox, n: int) -> None:
    for i in range(n):
        await mb.send("t::lead", "t::w", f"m{i}")
    await mb.aclose()


async def test_connections_the_server_dropped_between_calls_are_replaced_before_any_call(prefix, raw):
    # the store keeps a few connections between its calls (as a pool keeps idle ones);
    # the server drops them all: each is found dead before a command goes on it and
    # replaced (lattice_mailbox.connections), so no call fails and each ran once
    name = f"lattice-test-{uuid.uuid4().hex[:12]}"
    mb = RedisMailbox(REDIS_URL, prefix=prefix, client_name=name)
    await mb.send("t::lead", "t::w", "before")
    await asyncio.gather(*(mb.claim_next("t::idle") for _ in range(3)))  # several connections
    ours = [c for c in await raw.client_list() if c.get("name") == name]
    assert ours
    for entry in ours:
        await raw.client_kill_filter(_id=entry["id"])
    stored = ["before"]
    for i in range(len(ours) + 2):
        await mb.send("t::lead", "t::w", f"after {i}")
        stored.append(f"after {i}")
    assert [m.content for m in await mb.inbox("t::w")] == stored
    claimed = await mb.claim_next("t::w", lease_s=30)
    assert claimed is not None and claimed.attempts == 1
    await mb.complete(claimed.id, claimed.claim_token, "done")
    await _consistent(raw, prefix, "t::w")
    await mb.aclose()
