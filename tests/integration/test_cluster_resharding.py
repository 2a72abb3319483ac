"""A mailbox whose slot moves to another master while it is used (a resharding).

``RedisClusterServers.migrate_slot`` moves the slot of one mailbox's hash tag
key by key, in a thread: meanwhile part of its keys lie on the old master and
part on the new one, so the mailbox's scripts (several keys each) get ``ASK``
redirects and ``TRYAGAIN`` until the move ends. The test sends, claims and
completes messages on that mailbox all the while. Every call must succeed (redis-py follows ``ASK``;
the policy sends a ``TRYAGAIN``-ed call again), and afterwards every message is
there once, in order, each claimed once.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter

import pytest

from lattice_mailbox.redis import RedisMailbox
from lattice_mailbox.redis_layout import Keys
from lattice_mailbox.validation import mailbox_tag

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(120)]


def _redirects(cluster, *ports: int) -> Counter[str]:
    """``ASK`` / ``TRYAGAIN`` / ``MOVED`` replies the nodes on ``ports`` gave (``INFO errorstats``)."""
    seen: Counter[str] = Counter()
    for port in ports:
        with cluster.admin(port) as client:
            for name, stats in client.info("errorstats").items():
                seen[name.removeprefix("errorstat_")] += int(stats["count"])
    return seen


def test_a_mailbox_keeps_working_while_its_slot_moves_to_another_master(redis_cluster):
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    box = "team::worker"
    loop = asyncio.new_event_loop()
    store = RedisMailbox(redis_cluster.url, prefix=prefix)
    sent: list[str] = []
    done: list[str] = []

    async def traffic() -> None:
        # two sends, one claim finished: the mailbox's scripts run while its keys are split
        for _ in range(2):
            sent.append((await store.send("team::lead", box, f"m{len(sent)}")).content)
        claim = await store.claim_next(box, lease_s=30)
        assert claim is not None
        await store.complete(claim.id, claim.claim_token, "done")
        done.append(claim.content)

    try:
        loop.run_until_complete(traffic())  # every key of the tag exists before the move
        key = Keys.build(prefix, mailbox_tag(box)).state.decode()
        source = redis_cluster.master_of(key)
        target = next(p for p in redis_cluster.masters() if p != source)
        before = _redirects(redis_cluster, source, target)
        mover = threading.Thread(target=redis_cluster.migrate_slot, args=(key, target), kwargs={"pause": 0.2})
        mover.start()
        while mover.is_alive():
            loop.run_until_complete(traffic())
        mover.join()
        assert redis_cluster.master_of(key) == target
        redirects = _redirects(redis_cluster, source, target) - before
        assert redirects["ASK"] > 0  # the calls did meet the split slot
        loop.run_until_complete(traffic())  # after the move: the client's map is stale, MOVED

        async def check() -> None:
            messages = await store.inbox(box, "all")
            assert [m.content for m in messages] == sent  # each once, in send order
            assert [m.content for m in messages if m.status.value == "done"] == done
            assert done == sent[: len(done)]  # FIFO claims, none claimed twice
            assert all(m.attempts == (1 if m.status.value == "done" else 0) for m in messages)

        loop.run_until_complete(check())
        assert len(done) >= 4
    finally:
        loop.run_until_complete(store.aclose())
        loop.close()
        redis_cluster.delete_prefix(f"{prefix}:")
