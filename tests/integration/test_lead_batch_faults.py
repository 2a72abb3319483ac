"""Faults around a lead tool batch's one-round-trip registration + suspension
(``lead_dispatch.dispatch_items(suspend=True)``), on the real Redis.

* A script the server has not cached (after a restart or failover, scripts come
  back one by one) must not reorder the batch: the history write goes before
  the suspension, or the fenced history write is refused and lost.
* A segment that lost its lease counts no token usage (the recovering segment
  counts its own).
"""

from __future__ import annotations

import hashlib
import json
import types
import uuid
from typing import Any

import pytest

import lattice_client.runstore.scripts as runs_mod
from lattice_client.errors import RunLeaseLostError
from lattice_client.models import RunStatus
from lattice_worker.runtime.lead.dispatch import DistributedLeadRuntime, dispatch_items
from lattice_worker.runtime.lead.lease import FencedHistoryStore, LeadLease
from tests.support.workers import worker_context

CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ask_bob", "input": {}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "placeholder"}]}
ITEM = {
    "work_item_id": "w1",
    "message_id": "m1",
    "mailbox_id": "team::bob",
    "member": "bob",
    "mode": "ask",
    "tool_use_id": "t1",
}
TEAM = types.SimpleNamespace(
    name="team",
    expose_lead_mailbox_tools=False,
    runner_options=types.SimpleNamespace(max_concurrent_work_items=4),
)


@pytest.mark.parametrize("uncached", ["write_history", "suspend"])
async def test_an_uncached_script_does_not_reorder_the_batch(
    prefix: str, raw: Any, monkeypatch: pytest.MonkeyPatch, uncached: str
) -> None:
    # A different source (a unique trailing comment) is a script this server has
    # never seen: the state of a script cache after a restart, without flushing
    # the scripts other tests use.
    source = runs_mod.SCRIPTS[uncached] + f"\n-- uncached {uuid.uuid4().hex}\n"
    monkeypatch.setitem(runs_mod.SCRIPTS, uncached, source)
    monkeypatch.setitem(runs_mod.SHAS, uncached, hashlib.sha1(source.encode()).hexdigest())
    sent: list[Any] = []
    ctx = worker_context(prefix, send_task=lambda *args: sent.append(args))
    runs = ctx.runs
    try:
        await runs.create("r1", "team", "p")
        start = await runs.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30)
        assert start is not None
        lease = LeadLease(runs, "r1", start, 30)
        store = FencedHistoryStore(
            lease, ctx.client, ctx.keys.history("r1"), ttl_seconds=60, writer=ctx.writer
        )
        await store.append(CALL)  # queued, as in the lead's query
        await store.append(RESULT)

        suspended = await dispatch_items(ctx, "r1", TEAM, [dict(ITEM)], lease=lease, suspend=True)

        assert suspended is True
        assert raw.hget(runs.keys("r1").record, "status") == "suspended"
        assert [json.loads(m) for m in raw.lrange(ctx.keys.history("r1"), 0, -1)] == [CALL, RESULT]
        assert [args[1] for args in sent] == [["team::bob", "m1"]]  # the doorbell of its message rang once
    finally:
        await runs.aclose()


async def test_a_segment_that_lost_its_lease_counts_no_usage(prefix: str, raw: Any) -> None:
    ctx = worker_context(prefix)
    runs = ctx.runs
    try:
        await runs.create("r1", "team", "p")
        start = await runs.begin_segment("r1", expect=RunStatus.QUEUED, lease_s=30)
        assert start is not None
        lease = LeadLease(runs, "r1", start, 30)
        raw.hset(runs.keys("r1").record, "lease_token", "another-segment")  # taken over meanwhile
        runtime = DistributedLeadRuntime(ctx, TEAM, "r1", lease, usage={})  # type: ignore[arg-type]
        runtime.pending = [dict(ITEM)]
        outcome = types.SimpleNamespace(
            calls=[{"id": "t1"}], usage={"input_tokens": 1000, "output_tokens": 50}
        )

        with pytest.raises(RunLeaseLostError):
            await runtime.after_tool_batch(outcome)
        await ctx.writer.flush()

        assert lease.lost
        assert raw.hgetall(ctx.keys.usage("r1")) == {}
        assert raw.smembers(runs.keys("r1").wait) == set()
    finally:
        await runs.aclose()
