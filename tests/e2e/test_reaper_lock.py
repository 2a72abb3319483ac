"""End-to-end: a worker killed (kill -9) while its reaper holds the reaper lock
mid-sweep delays the deployment's recovery by about half a lease, not a minute.

Two real ``lattice worker`` processes serve the ``e2e`` team; their sweeps are
slowed down by ``LATTICE_REAPER_SCAN_PAUSE_SECONDS`` (a pause after each member
mailbox the lost-doorbell scan reads) over ten mailboxes of the team, so a
sweep lasts about ten seconds. Whichever worker holds the lock mid-sweep is
killed with its process group; a claim whose worker died expires just after;
the survivor must requeue it within two leases of its expiry.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from lattice_mailbox.redis import RedisMailbox
from lattice_worker.runtime.reaper.lock import lock_key
from tests.e2e.conftest import Deployment, Proc, wait_for
from tests.support.services import REDIS_URL

pytestmark = [pytest.mark.e2e, pytest.mark.redis, pytest.mark.timeout(150)]

LEASE_S = 4.0
"""The deployment's lease: the lock's hold is 2 s."""

SCAN_PAUSE_S = 1.0
INTERVAL_S = 0.5


async def _mailboxes_to_scan(prefix: str, count: int) -> None:
    """``count`` member mailboxes of the team, each with one finished message
    (read by the lost-doorbell scan, nothing to ring)."""
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    try:
        for i in range(count):
            box = f"e2e::idle{i}"
            await mailbox.send("e2e::lead", box, f"finished {i}")
            claimed = await mailbox.claim_next(box, lease_s=60, worker_id="test")
            await mailbox.complete(claimed.id, claimed.claim_token, "done")
    finally:
        await mailbox.aclose()


async def _claim_of_a_dead_worker(prefix: str, lease_s: float) -> tuple[str, float]:
    """A claim nobody renews (its worker is gone): ``(message id, lease end, epoch s)``."""
    mailbox = RedisMailbox(REDIS_URL, prefix=prefix)
    try:
        await mailbox.send("e2e::lead", "ops::box", "claimed by a worker that dies")
        claimed = await mailbox.claim_next("ops::box", lease_s=lease_s, worker_id="dead-worker")
        return claimed.id, claimed.lease_until / 1000.0
    finally:
        await mailbox.aclose()


def _holder(d: Deployment, workers: list[Proc]) -> tuple[Proc, str] | None:
    """The worker whose reaper holds the lock mid-sweep (the hold, not the
    shorter rest-of-the-interval a finished sweep leaves), and its token."""
    key = lock_key(d.prefix)
    token, ttl = d.redis.get(key), d.redis.pttl(key)
    if not token or ttl <= 1000 * INTERVAL_S + 300:
        return None
    pid = int(token.split(":")[1])  # "<host>:<pid>:<random>:<random hex>"
    try:
        group = os.getpgid(pid)
    except ProcessLookupError:
        return None
    for worker in workers:
        if worker.pgid == group:
            return worker, token
    return None


def test_a_killed_lock_holder_delays_the_requeue_of_an_expired_claim_by_under_a_lease(deployment_factory):
    d = deployment_factory(
        lease_seconds=LEASE_S,
        reaper_interval_seconds=INTERVAL_S,
        reaper_scan_pause_seconds=SCAN_PAUSE_S,
    )
    asyncio.run(_mailboxes_to_scan(d.prefix, 10))
    workers = [d.worker("tests.e2e.teams:team", "--concurrency", "1") for _ in range(2)]
    doomed, token = wait_for(lambda: _holder(d, workers), 40, "a reaper mid-sweep")
    message_id, expires_at = asyncio.run(_claim_of_a_dead_worker(d.prefix, 0.5))
    doomed.kill9()
    assert d.redis.get(lock_key(d.prefix)) == token  # the dead holder's lock is still there
    [survivor] = [w for w in workers if w is not doomed]

    def requeued() -> float | None:
        [message] = d.client.inbox("ops::box", "all")
        return time.time() if message.status.value == "pending" else None

    at = wait_for(requeued, 4 * LEASE_S, "the expired claim to be requeued", interval=0.05)
    assert at - expires_at < 2 * LEASE_S, f"requeued {at - expires_at:.1f} s after its lease ended"
    [message] = d.client.inbox("ops::box", "all")
    assert (message.id, message.attempts, message.claim_token) == (message_id, 1, None)
    holder = d.redis.get(lock_key(d.prefix))
    assert holder != token and survivor.alive()
    survivor.wait_log(r"lease of message \S+ in ops::box expired \(attempt 1\); requeued")
